"""TrtllmTargetRunner's bookkeeping (prompt-append inputs, output parsing, commit / rewind, sampled rows).

TensorRT-LLM cannot run here, so the executor is an EMULATOR OF OUR ENGINE CONTRACT (the outputs
docs/trtllm-backend.md declares: dflash_taps, dflash_accept, dflash_tail_taps, dflash_tail_logits,
computed by the torch target over each request's full input). It shows the runner + scheduler +
ONNX draft graphs decode losslessly given an engine honoring that contract; it does not show that
TensorRT-LLM honors it (the `trtllm`/`gpu` tests at the bottom do, on a GPU machine).
"""

from types import SimpleNamespace

import pytest
import torch

from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.decoding.verify import accept_length
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.runtime.runner import TorchDraftRunner, TorchTargetRunner
from dflash_trt.trtllm.golden import decode
from dflash_trt.trtllm.runner import TrtllmTargetRunner, block_input, output_tensor, parse_accept
from dflash_trt.trtllm.target_model_cls import tail_rows_reference

SLOTS, MAX_SEQ = 3, 96


class _Obj(SimpleNamespace):
    def __init__(self, *args, **kwargs):
        super().__init__(args=args, **kwargs)


TLE = SimpleNamespace(Request=_Obj, SamplingConfig=_Obj, OutputConfig=_Obj,
                      AdditionalModelOutput=lambda name, gather: (name, gather))


class EngineEmulator:
    """Answers executor requests with the declared DFlash outputs, computed by the torch target."""

    def __init__(self, target, tap_layers, num_drafts, drop_rows: int = 0):
        self.target, self.tap_layers, self.k, self.drop_rows = target, tuple(tap_layers), num_drafts, drop_rows
        self.responses, self.inputs = {}, []

    def enqueue_requests(self, requests):
        ids = []
        for request in requests:
            ids.append(len(self.inputs))
            self.inputs.append(list(request.input_token_ids))
            outputs = self._outputs(request.input_token_ids, request.output_config.additional_model_outputs)
            self.responses[ids[-1]] = SimpleNamespace(has_error=lambda: False, result=SimpleNamespace(
                additional_outputs=[SimpleNamespace(name=n, output=t) for n, t in outputs.items()]))
        return ids

    def await_responses(self, request_id):
        return [self.responses.pop(request_id)]

    @torch.inference_mode()
    def _outputs(self, ids, requested) -> dict:
        n = len(ids)
        cache = KVCache(len(self.target.model.layers), 1, n + 1, 2, 16)
        logits, taps = self.target(torch.tensor([ids]), torch.arange(n)[None], cache, torch.tensor([0]), self.tap_layers)
        rows, valid = tail_rows_reference([n], self.k)
        rows, valid = torch.from_numpy(rows[0]), int(valid[0]) - self.drop_rows
        tail_logits = logits[0, rows]  # [K+1, V]
        tokens = tail_logits.argmax(-1)
        drafts = torch.tensor(ids)[rows[1:]]
        accepted = int(accept_length(drafts[None], tokens[None])[0])
        values = {"dflash_taps": taps[0], "dflash_tail_taps": taps[0, rows].reshape(1, -1),
                  "dflash_tail_logits": tail_logits.reshape(1, -1),
                  "dflash_accept": torch.tensor([[accepted, valid, *tokens.tolist()]], dtype=torch.int32)}
        return {("context_" if gather else "generation_") + name: values[name] for name, gather in requested}


def _runner(pair, drop_rows=0):
    d = pair.draft.config
    settings = {"num_drafts": d.block_size - 1, "vocab_size": pair.target.config.vocab_size,
                "target_layer_ids": list(d.target_layer_ids), "hidden_size": d.dims.hidden_size}
    emulator = EngineEmulator(pair.target, d.target_layer_ids, d.block_size - 1, drop_rows)
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
    outputs = {"generation_dflash_accept": torch.zeros(1, 6), "context_dflash_taps": torch.ones(2, 4)}
    assert output_tensor(outputs, "dflash_taps").shape == (2, 4)
    with pytest.raises(Exception, match="rebuild"):
        output_tensor(outputs, "dflash_tail_taps")


def test_tail_rows_clamp_to_each_request():
    rows, valid = tail_rows_reference([1, 6, 26], 3)  # requests of 1, 5 and 20 packed rows
    assert rows.tolist() == [[0, 0, 0, 0], [2, 3, 4, 5], [22, 23, 24, 25]]
    assert valid.tolist() == [1, 4, 4]


@pytest.mark.parametrize("schedule", [None, {3: 4}])
def test_runner_decodes_losslessly_against_the_engine_contract(loaded_tiny_pair, tmp_path, schedule):
    """Emulated target engine + the ONNX draft graphs on onnxruntime == the torch path == AR
    (full blocks, and narrower verify widths: the engine's tail is K+1 rows, the runner reads the last w)."""
    pytest.importorskip("onnxruntime")
    from dflash_trt.trtllm.draft_runner import ort_draft_runner
    from dflash_trt.trtllm.onnx_export import export_draft_graphs, spec_for

    pair, capacity = loaded_tiny_pair, MAX_SEQ + loaded_tiny_pair.draft.config.block_size + 1
    d = pair.draft.config
    export_draft_graphs(pair.draft, pair.target, spec_for(pair.draft, pair.target, d.block_size, capacity, SLOTS,
                                                          "fp32"), tmp_path)
    requests = _requests(pair.target.config.vocab_size)
    runner, emulator = _runner(pair)
    draft = ort_draft_runner(tmp_path, SLOTS)
    got = decode(runner, draft, requests, SLOTS, capacity, block_size_schedule=schedule)
    reference = decode(TorchTargetRunner(pair.target, SLOTS, capacity, d.target_layer_ids),
                       TorchDraftRunner(pair.draft, pair.target, SLOTS, capacity, d.block_size), requests, SLOTS, capacity,
                       block_size_schedule=schedule)
    ar_runner, _ = _runner(pair)
    ar = decode(ar_runner, None, requests, SLOTS, capacity)  # blocks of 1: the last tail row
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


@pytest.mark.gpu
@pytest.mark.trtllm
def test_trtllm_bundle_decodes_like_torch():
    """On a GPU with TensorRT-LLM 1.2.1 and a built bundle ($DFLASH_TRT_TRTLLM_BUNDLE)."""
    import os

    pytest.importorskip("tensorrt_llm")
    if not torch.cuda.is_available() or not os.environ.get("DFLASH_TRT_TRTLLM_BUNDLE"):
        pytest.skip("needs a CUDA GPU, TensorRT-LLM and DFLASH_TRT_TRTLLM_BUNDLE=<bundle built with backend trtllm>")
    from dflash_trt.engine.bundle import read_manifest
    from dflash_trt.trtllm.runner import load_trtllm_runners

    bundle = os.environ["DFLASH_TRT_TRTLLM_BUNDLE"]
    manifest = read_manifest(bundle)
    target, draft = load_trtllm_runners(bundle, 4)
    golden = manifest["golden"]
    requests = [Request(tuple(o["prompt_ids"]), stop=StopCriteria(golden["max_new_tokens"])) for o in golden["outputs"]]
    got = decode(target, draft, requests, 4, draft.spec.capacity, device=target.device)
    assert [r.tokens for r in got] == [o["token_ids"] for o in golden["outputs"]]
