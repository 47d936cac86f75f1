"""TrtllmTargetRunner's bookkeeping (prompt-append inputs, output parsing, commit / rewind, sampled rows,
KV salts and the prefix cache) against an emulator of TensorRT-LLM's Executor.

TensorRT-LLM cannot run here, so the executor is `trtllm_emulator.ExecutorEmulator`: it computes the
engine's DFlash outputs with the torch target and returns them the way UPSTREAM's executor does (both
result prefixes for gather_context outputs, [1, 1, X] generation tensors, uninitialised rows for a reused
KV prefix, the registration checks), each rule citing its source. It shows the runner + scheduler + ONNX
draft graphs decode losslessly given upstream's contract; the `trtllm`/`gpu` test at the bottom runs the
real thing on a GPU machine.
"""

import pytest
import torch
from trtllm_emulator import TLE, ExecutorEmulator, ExecutorError

from dflash_trt.backends.torch.runners import TorchDraftRunner, TorchTargetRunner
from dflash_trt.backends.trtllm.io_spec import TargetOutputs
from dflash_trt.backends.trtllm.runner import TrtllmTargetRunner, block_input, output_tensor, parse_accept, result_name
from dflash_trt.backends.trtllm.target_build import engine_lengths
from dflash_trt.backends.trtllm.target_model_cls import tail_rows_reference
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.runtime.generate import decode

SLOTS, MAX_SEQ = 3, 96


def _runner(pair, drop_rows=0, sampled=True, tokens_per_block=4):
    d = pair.draft.config
    outputs = TargetOutputs(len(d.target_layer_ids), d.dims.hidden_size, pair.target.config.vocab_size, d.block_size,
                            "fp32", sampled).to_list()
    settings = {"num_drafts": d.block_size - 1, "vocab_size": pair.target.config.vocab_size,
                "target_layer_ids": list(d.target_layer_ids), "hidden_size": d.dims.hidden_size, "outputs": outputs,
                "tokens_per_block": tokens_per_block}
    registered = [(o["name"], o["gather_context"]) for o in outputs]  # what TrtllmTargetRunner.open registers
    tokens = engine_lengths(MAX_SEQ, d.block_size, SLOTS)["max_num_tokens"]  # what trtllm-build gets
    emulator = ExecutorEmulator(pair.target, d.target_layer_ids, d.block_size - 1, registered,
                                {o["name"] for o in outputs}, tokens_per_block, tokens, drop_rows=drop_rows)
    return TrtllmTargetRunner(emulator, TLE, settings, SLOTS, device="cpu"), emulator


def _requests(vocab):
    g = torch.Generator().manual_seed(11)
    return [Request(tuple(torch.randint(0, vocab, (n,), generator=g).tolist()), SamplingParams(t, 0, 1.0, i),
                    StopCriteria(24)) for i, (n, t) in enumerate([(2, 0.0), (11, 0.9), (6, 0.0), (25, 0.0), (4, 1.0)])]


def test_parse_accept_and_block_input():
    assert parse_accept(torch.tensor([[2, 4, 7, 8, 9, 10]], dtype=torch.int32), 3) == (2, 4, [7, 8, 9, 10])
    with pytest.raises(Exception, match="expected 6"):
        parse_accept(torch.tensor([1, 2, 3]), 3)
    assert block_input([1, 2, 3, 4], 3, [9, 5, 6]) == [1, 2, 3, 9, 5, 6]  # rejected drafts dropped
    with pytest.raises(ValueError):
        block_input([1, 2], 3, [9])
    assert result_name("dflash_taps", True) == "context_dflash_taps"
    assert result_name("dflash_accept", False) == "generation_dflash_accept"
    outputs = {"generation_dflash_accept": torch.zeros(1, 1, 6), "context_dflash_taps": torch.ones(2, 4),
               "generation_dflash_taps": torch.ones(1, 1, 4)}  # what createResult returns for a gather output
    assert output_tensor(outputs, "dflash_taps", True).shape == (2, 4)  # the prompt rows, not the last row
    assert parse_accept(output_tensor(outputs, "dflash_accept", False), 3)[1] == 0
    with pytest.raises(Exception, match="rebuild"):
        output_tensor(outputs, "dflash_tail_logits", False)


def test_tail_rows_clamp_to_each_request():
    rows, valid = tail_rows_reference([1, 6, 26], 3)  # requests of 1, 5 and 20 packed rows
    assert rows.tolist() == [[0, 0, 0, 0], [2, 3, 4, 5], [22, 23, 24, 25]]
    assert valid.tolist() == [1, 4, 4]


@pytest.mark.parametrize("schedule", [None, {3: 4}])
def test_runner_decodes_losslessly_against_the_engine_contract(loaded_tiny_pair, tmp_path, schedule):
    """Emulated target engine + the ONNX draft graphs on onnxruntime == the torch path == AR
    (full blocks, and narrower verify widths: the engine's tail is K+1 rows, the runner reads the last w)."""
    pytest.importorskip("onnxruntime")
    from dflash_trt.backends.trtllm.draft_runner import ort_draft_runner
    from dflash_trt.backends.trtllm.onnx_export import export_draft_graphs, spec_for

    pair, capacity = loaded_tiny_pair, MAX_SEQ + loaded_tiny_pair.draft.config.block_size + 1
    d = pair.draft.config
    export_draft_graphs(pair.draft, pair.target, spec_for(pair.draft, pair.target, d.block_size, capacity, SLOTS,
                                                          "fp32"), tmp_path)
    requests = _requests(pair.target.config.vocab_size)
    runner, emulator = _runner(pair)
    draft = ort_draft_runner(tmp_path, SLOTS)
    got = decode(runner, draft, requests, SLOTS, block_size_schedule=schedule)
    # the graphs draft greedily for sampled rows too
    from draft_runners import GreedyDrafts

    reference = decode(TorchTargetRunner(pair.target, SLOTS, capacity, d.target_layer_ids),
                       GreedyDrafts(TorchDraftRunner(pair.draft, pair.target, SLOTS, capacity, d.block_size)), requests,
                       SLOTS, block_size_schedule=schedule)
    ar_runner, _ = _runner(pair)
    ar = decode(ar_runner, None, requests, SLOTS)  # blocks of 1: the last tail row
    assert [r.tokens for r in got] == [r.tokens for r in reference] == [r.tokens for r in ar]
    assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in reference]
    assert len(emulator.inputs) > 3 * len(requests)  # one executor request per slot per step


def test_runner_first_token_of_sampled_prefill_uses_the_sampling_rule(loaded_tiny_pair):
    runner, _ = _runner(loaded_tiny_pair)
    prompts = [(5, 6, 7), (1, 2, 3, 4, 5, 6, 7, 8, 9)]
    sampling = (torch.tensor([0.0, 0.7]), torch.tensor([0, 5]), torch.tensor([1.0, 0.9]), torch.tensor([3, 4]))
    first, taps, positions, lengths = runner.prefill(torch.tensor([0, 2]), prompts, sampling)
    reference = TorchTargetRunner(loaded_tiny_pair.target, SLOTS, 64, loaded_tiny_pair.draft.config.target_layer_ids)
    expected, expected_taps, _, _ = reference.prefill(torch.tensor([0, 2]), prompts, sampling)
    assert torch.equal(first, expected)
    for b, n in enumerate(lengths.tolist()):  # rows past a prompt's length are padding
        torch.testing.assert_close(taps[b, :n], expected_taps[b, :n], atol=1e-5, rtol=1e-5)
    assert lengths.tolist() == [3, 9] and runner.history[2] == list(prompts[1])


def test_runner_refuses_blocks_the_engine_did_not_recompute(loaded_tiny_pair):
    runner, _ = _runner(loaded_tiny_pair, drop_rows=2)
    sampling = tuple(torch.zeros(1) for _ in range(4))
    runner.prefill(torch.tensor([0]), [(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)], sampling)
    block = torch.tensor([[4] + [0] * (loaded_tiny_pair.draft.config.block_size - 1)])
    with pytest.raises(RuntimeError, match="recomputed"):
        runner.verify(torch.tensor([0]), block, torch.tensor([10]), sampling)


def test_commit_rewinds_to_the_committed_length(loaded_tiny_pair):
    runner, emulator = _runner(loaded_tiny_pair)
    sampling = tuple(torch.zeros(1) for _ in range(4))
    runner.prefill(torch.tensor([1]), [(1, 2, 3)], sampling)
    width = loaded_tiny_pair.draft.config.block_size
    runner.verify(torch.tensor([1]), torch.tensor([[9] + list(range(20, 20 + width - 1))]), torch.tensor([3]), sampling)
    runner.commit(torch.tensor([1]), torch.tensor([5]))  # bonus + one accepted draft
    assert runner.history[1] == [1, 2, 3, 9, 20]
    runner.verify(torch.tensor([1]), torch.tensor([[7] * width]), torch.tensor([5]), sampling)
    assert emulator.inputs[-1][:6] == [1, 2, 3, 9, 20, 7]


def test_a_greedy_engine_has_no_block_logits_and_refuses_sampled_requests(loaded_tiny_pair):
    runner, emulator = _runner(loaded_tiny_pair, sampled=False)
    assert not runner.serves_sampled and "dflash_tail_logits" not in emulator.registered
    greedy = tuple(torch.zeros(1) for _ in range(4))
    runner.prefill(torch.tensor([0]), [(1, 2, 3, 4)], greedy)
    sampled = (torch.tensor([0.8]), torch.zeros(1, dtype=torch.int64), torch.ones(1), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="greedy requests only"):
        runner.prefill(torch.tensor([1]), [(1, 2, 3, 4)], sampled)


def test_a_shared_prefix_without_its_drafter_context_never_hides_taps(loaded_tiny_pair):
    """Two prompts sharing a 3-block system prompt and no prefix cache: without salts upstream reuses the first
    one's blocks and leaves the second's prefix rows of context_dflash_taps unwritten; the runner sees the engine
    could reuse rows it has no drafter context for and gives the second sequence a salt of its own, so both get
    every row, and each sequence's verifies still reuse its own history."""
    pair = loaded_tiny_pair
    system = list(range(10, 22))  # 12 tokens = 3 blocks of 4
    prompts = [tuple(system + [5, 6, 7]), tuple(system + [8, 9])]
    greedy = tuple(torch.zeros(1) for _ in range(4))

    _, raw = _runner(pair)  # the hazard, straight at the executor: same prefix, no salt
    for prompt in prompts:
        raw.enqueue_requests([TLE.Request(input_token_ids=list(prompt), output_config=TLE.OutputConfig(
            additional_model_outputs=[("dflash_taps", True)]))])
    second = raw.await_responses(1)[0].result.additional_outputs[0].output
    assert raw.computed[1] == 2 and torch.isnan(second[:12]).all()

    runner, emulator = _runner(pair)
    reference = TorchTargetRunner(pair.target, SLOTS, 64, pair.draft.config.target_layer_ids)
    for slot, prompt in enumerate(prompts):
        _, taps, _, _ = runner.prefill(torch.tensor([slot]), [prompt], greedy)
        _, expected, _, _ = reference.prefill(torch.tensor([slot]), [prompt], greedy)
        torch.testing.assert_close(taps[0, : len(prompt)], expected[0, : len(prompt)], atol=1e-5, rtol=1e-5)
    assert emulator.computed == [15, 14] and emulator.salts[0] != emulator.salts[1]
    width = pair.draft.config.block_size
    runner.verify(torch.tensor([0]), torch.tensor([[7] + [0] * (width - 1)]), torch.tensor([14]), greedy)
    assert emulator.salts[-1] == emulator.salts[0] and emulator.computed[-1] < width + 4  # its own history reused


def test_the_emulated_executor_checks_registration_like_upstream(loaded_tiny_pair):
    d = loaded_tiny_pair.draft.config
    with pytest.raises(ExecutorError, match="without a buffer"):  # an engine output nobody registered
        ExecutorEmulator(loaded_tiny_pair.target, d.target_layer_ids, d.block_size - 1, [("dflash_taps", True)],
                         {"dflash_taps", "dflash_accept"})
    emulator = ExecutorEmulator(loaded_tiny_pair.target, d.target_layer_ids, d.block_size - 1,
                                [("dflash_taps", True), ("dflash_accept", False)], {"dflash_taps", "dflash_accept"})
    for outputs, message in (([("dflash_accept", True)], "not gathered"), ([("dflash_tail_logits", False)], "not found")):
        with pytest.raises(ExecutorError, match=message):
            emulator.enqueue_requests([TLE.Request(input_token_ids=[1, 2, 3],
                                                   output_config=TLE.OutputConfig(additional_model_outputs=outputs))])
    (i,) = emulator.enqueue_requests([TLE.Request(input_token_ids=[1, 2, 3], output_config=TLE.OutputConfig(
        additional_model_outputs=[("dflash_taps", True), ("dflash_accept", False)]))])
    got = {o.name: tuple(o.output.shape) for o in emulator.await_responses(i)[0].result.additional_outputs}
    width = len(d.target_layer_ids) * d.dims.hidden_size
    assert got == {"context_dflash_taps": (3, width), "generation_dflash_taps": (1, 1, width),
                   "generation_dflash_accept": (1, 1, d.block_size + 2)}


@pytest.mark.gpu
@pytest.mark.trtllm
def test_trtllm_bundle_decodes_like_torch():
    """On a GPU with TensorRT-LLM 1.2.1 and a built bundle ($DFLASH_TRT_TRTLLM_BUNDLE)."""
    import os

    pytest.importorskip("tensorrt_llm")
    if not torch.cuda.is_available() or not os.environ.get("DFLASH_TRT_TRTLLM_BUNDLE"):
        pytest.skip("needs a CUDA GPU, TensorRT-LLM and DFLASH_TRT_TRTLLM_BUNDLE=<bundle built with backend trtllm>")
    from dflash_trt.backends.trtllm.runner import load_trtllm_runners
    from dflash_trt.engine.bundle import read_manifest

    bundle = os.environ["DFLASH_TRT_TRTLLM_BUNDLE"]
    manifest = read_manifest(bundle)
    target, draft = load_trtllm_runners(bundle, 4)
    golden = manifest["golden"]
    requests = [Request(tuple(o["prompt_ids"]), stop=StopCriteria(golden["max_new_tokens"])) for o in golden["outputs"]]
    got = decode(target, draft, requests, 4)
    assert [r.tokens for r in got] == [o["token_ids"] for o in golden["outputs"]]


def _chain(pair, requests, prefix_cache_bytes: int, draft=None):
    """The emulated engine (KV blocks of the prefix cache's size: the built engines' TOKENS_PER_BLOCK is a multiple
    of it) + the torch drafter through the engine loop, one request after another (a chain)."""
    from dflash_trt.runtime.generate import Engine
    from dflash_trt.runtime.prefix_cache import BLOCK
    from dflash_trt.runtime.scheduler import ServiceLimits

    d = pair.draft.config
    runner, emulator = _runner(pair, tokens_per_block=BLOCK)
    limits = ServiceLimits(SLOTS, MAX_SEQ, d.block_size, width_policy="schedule", prefix_cache_bytes=prefix_cache_bytes)
    draft = draft() if draft else TorchDraftRunner(pair.draft, pair.target, SLOTS, MAX_SEQ + d.block_size + 1,
                                                   d.block_size)
    engine = Engine(runner, draft, limits)
    return [engine.generate([r])[0] for r in requests], emulator


def test_prefix_cache_on_the_engine_route_reuses_blocks_and_keeps_acceptance(loaded_tiny_pair):
    """A chain of calls sharing a 40-token system prompt: with the prefix cache, each warm call's prefill skips the
    cached prefix in the engine (KV block reuse under the shared salt) while the drafter reads its context from the
    draft runner's block pool: tokens of AR, acceptance of the same call cold."""
    pair = loaded_tiny_pair
    system = list(range(30, 70))
    requests = [Request(tuple(system + [5 + i, 9, 11 + i]), SamplingParams(0.0), StopCriteria(16)) for i in range(3)]
    warm, emulator = _chain(pair, requests, 1 << 22)
    cold = [_chain(pair, [r], 0)[0][0] for r in requests]
    ar_runner, _ = _runner(pair)
    ar = decode(ar_runner, None, requests, SLOTS)
    assert [r.tokens for r in warm] == [r.tokens for r in cold] == [r.tokens for r in ar]
    assert [r.acceptance_lengths for r in warm] == [r.acceptance_lengths for r in cold]
    assert [r.cached_tokens for r in warm] == [0, 32, 32]
    prefills = [i for i, tokens in enumerate(emulator.inputs) if list(tokens) in [list(r.prompt) for r in requests]]
    assert [emulator.computed[i] for i in prefills] == [43, 11, 11]  # 32 cached rows reused by the engine


def test_the_draft_graphs_keep_their_context_per_cached_block(loaded_tiny_pair, tmp_path):
    """The same chain with the ONNX draft graphs (the runner a trtllm bundle drafts with): their context cache goes
    to and from the block pool, warm calls draft as cold ones."""
    pytest.importorskip("onnxruntime")
    from dflash_trt.backends.trtllm.draft_runner import ort_draft_runner
    from dflash_trt.backends.trtllm.onnx_export import export_draft_graphs, spec_for

    pair, capacity = loaded_tiny_pair, MAX_SEQ + loaded_tiny_pair.draft.config.block_size + 1
    export_draft_graphs(pair.draft, pair.target, spec_for(pair.draft, pair.target, pair.draft.config.block_size,
                                                          capacity, SLOTS, "fp32"), tmp_path)
    system = list(range(30, 70))
    requests = [Request(tuple(system + [5 + i, 9, 11 + i]), SamplingParams(0.0), StopCriteria(16)) for i in range(3)]
    graphs = lambda: ort_draft_runner(tmp_path, SLOTS)  # noqa: E731
    warm, emulator = _chain(pair, requests, 1 << 22, graphs)
    cold = [_chain(pair, [r], 0, graphs)[0][0] for r in requests]
    assert [r.tokens for r in warm] == [r.tokens for r in cold]
    assert [r.acceptance_lengths for r in warm] == [r.acceptance_lengths for r in cold]
    assert [r.cached_tokens for r in warm] == [0, 32, 32] and sum(emulator.computed) < sum(map(len, emulator.inputs))


def test_engine_kv_blocks_are_whole_prefix_cache_blocks():
    """A warm prompt shares the engine's blocks only as far as the prefix cache restored the drafter's context:
    with engine blocks a multiple of the cache's, what the engine can reuse is never past what the cache holds."""
    from dflash_trt.backends.trtllm.target_build import TOKENS_PER_BLOCK
    from dflash_trt.runtime.prefix_cache import BLOCK

    assert TOKENS_PER_BLOCK % BLOCK == 0


def test_a_repeated_call_shares_the_engine_blocks_without_losing_verify_rows(loaded_tiny_pair):
    """The same call twice: the second's verify inputs meet the first's stored blocks past its block start; the
    runner moves it to a salt of its own before the engine could reuse them (no refused step), same tokens."""
    pair = loaded_tiny_pair
    request = Request(tuple(range(30, 70)), SamplingParams(0.0), StopCriteria(24))
    (first, second), emulator = _chain(pair, [request, request], 1 << 22)
    assert first.tokens == second.tokens and second.cached_tokens == 32
    assert len(set(emulator.salts)) == 2  # the shared salt, then the second call's own
