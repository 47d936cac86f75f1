"""The torch runtime as it would run on a GPU, on tensors that say cuda:0 and compute on the CPU (tests/fake_cuda.py).

Proves without a GPU: no op mixes devices the way CUDA refuses, fp32 DFlash on "CUDA" gives plain AR decoding's
tokens, every feature of the engine (ragged batches, sampling, draft vocabulary, confidence cut, bad words, prefix
cache, the verify op's dispatch) gives the CPU run's tokens, and a decode step reads the device back at most
`STEP_SYNC_BUDGET` times, never between the draft pass and the verify pass (the region a CUDA graph would
capture).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
from fake_cuda import SYNCS, DeviceError, FakeCuda, fake_cuda, taped, to_fake

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.engine.config import ASSETS
from dflash_trt.model.loader import apply_draft_vocab, load_pair
from dflash_trt.runtime.local import local_engine

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.fake_cuda]
SLOW = pytest.mark.slow  # the fast tier keeps one greedy fp32 case of each

STEP_SYNC_BUDGET = 8  # device reads per decode step on the CUDA path (the step needs one: the accepted counts)


def shipped(dtype: str = "fp32"):
    return load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", dtype=dtype, device="cpu",
                     native_dtype=True)


@pytest.fixture(scope="module")
def pairs():
    """{dtype: (CPU pair, fake-CUDA pair)}, each loaded on its own (to_fake moves modules in place)."""
    out = {}
    for dtype in ("fp32", "bf16"):
        fake = shipped(dtype)
        with fake_cuda():
            to_fake((fake.target, fake.draft))
        out[dtype] = (shipped(dtype), fake)
    return out


def agent_requests(temperature: float, n: int = 3, new: int = 24) -> list[Request]:
    """Ragged prompts of the shipped tokenizer's ids, budgets of `new` tokens, one seed per request."""
    prompts = [tuple(range(40, 40 + 7 + 5 * i)) for i in range(n)]
    return [Request(p, SamplingParams(temperature, top_k=[0, 20][i % 2], top_p=[1.0, 0.9][i % 2], seed=100 + i),
                    StopCriteria(new)) for i, p in enumerate(prompts)]


def engine_tokens(pair, requests, **kw) -> list[list[int]]:
    limits = dict(max_seq_len=max(len(r.prompt) + r.stop.max_new_tokens for r in requests),
                  max_batch_size=len(requests), width_policy="schedule")
    limits.update(kw)
    engine = local_engine(pair, **limits)
    return [r.tokens for r in engine.generate(requests)]


# --- the fake device itself ---------------------------------------------------------------------------------------

def test_fake_tensors_compute_what_the_cpu_computes_and_count_syncs():
    torch.manual_seed(0)
    a, idx = torch.randn(4, 6), torch.tensor([2, 0])
    with fake_cuda() as syncs:
        fa = a.to("cuda")
        assert isinstance(fa, FakeCuda) and fa.device == torch.device("cuda", 0) and fa.is_cuda
        out = (fa.softmax(-1) @ fa.T).index_select(0, idx.to("cuda", non_blocking=True)).cumsum(1)
        assert torch.equal(out.cpu(), (a.softmax(-1) @ a.T).index_select(0, idx).cumsum(1))
        assert syncs.total == 2  # the blocking copies in and out; the non-blocking one is not a sync
        syncs.reset()
        int(fa[0, 0] > 0), fa.tolist(), fa[fa > 0], fa.nonzero(), fa.sum().item()
        kinds = sorted(kind for (kind, _), n in syncs.sites.items() for _ in range(n))
        assert kinds == ["boolean mask", "nonzero", "scalar read", "scalar read", "tolist"], syncs.table()
        syncs.reset()
        fa[torch.tensor([1])] = 0.0  # a host index tensor: CUDA accepts it
        fa + torch.tensor(1.0)  # a host 0-dim scalar: CUDA accepts it
        assert syncs.total == 0
        with pytest.raises(DeviceError, match="same device"):
            fa + a
        with pytest.raises(DeviceError, match="numpy"):
            fa.numpy()
        with pytest.raises(DeviceError, match="data_ptr"):
            fa.data_ptr()


def test_sync_sites_name_the_package_line_and_regions_count_apart():
    with fake_cuda() as syncs:
        x = torch.zeros(3, device="cuda")
        with syncs.region():
            bool(x.any())
        x.tolist()
    assert sum(syncs.in_region.values()) == 1 and syncs.total == 2
    assert all(site.startswith("test_fake_cuda.py:") for _, site in syncs.sites), syncs.table()


# --- decoding on fake CUDA ----------------------------------------------------------------------------------------

@SLOW
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reference_loop_and_ar_on_cuda_give_the_cpu_tokens(pairs, temperature):
    cpu, fake = pairs["fp32"]
    requests = agent_requests(temperature)
    expected = [r.tokens for r in autoregressive_generate(cpu.target, requests)]
    with fake_cuda():
        ar = [r.tokens for r in autoregressive_generate(fake.target, requests)]
        dflash = [r.tokens for r in speculative_generate(fake.target, fake.draft, requests)]
    assert ar == expected
    assert dflash == expected


@SLOW
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_on_cuda_gives_the_cpu_engines_tokens(pairs, dtype, temperature):
    """The torch runners under the scheduler, ragged batch of 3; fp32 equals plain AR as well."""
    cpu, fake = pairs[dtype]
    requests = agent_requests(temperature)
    from dflash_trt.backends.torch.runners import TorchDraftRunner, TorchTargetRunner

    with mock.patch("dflash_trt.backends.cpu.runners.CpuTargetRunner", TorchTargetRunner), \
            mock.patch("dflash_trt.backends.cpu.runners.CpuDraftRunner", TorchDraftRunner):
        expected = engine_tokens(cpu, requests)  # the same torch runners on the CPU
    with fake_cuda():
        got = engine_tokens(fake, requests)
        if dtype == "fp32":
            assert got == engine_tokens(fake, requests, autoregressive=True)
    assert got == expected


@SLOW
def test_engine_features_on_cuda_keep_the_tokens(pairs):
    """Draft vocabulary, the confidence cut, bad words and a warm prefix cache: the tokens of plain AR."""
    cpu, fake = pairs["fp32"]
    requests = agent_requests(0.0, n=2, new=20)
    expected = [r.tokens for r in autoregressive_generate(cpu.target, requests)]
    banned = [Request(r.prompt, r.params, r.stop, bad_words=((expected[0][3],),)) for r in requests]
    expected_banned = [r.tokens for r in autoregressive_generate(cpu.target, banned)]
    with fake_cuda():
        assert engine_tokens(fake, requests, min_confidence=0.3) == expected
        assert engine_tokens(fake, banned) == expected_banned
        engine = local_engine(fake, 64, width_policy="schedule", max_batch_size=2, prefix_cache_bytes=1 << 22)
        shared = [Request(tuple(range(30, 30 + 40)) + (7 + i,), SamplingParams(0.0), StopCriteria(12))
                  for i in range(3)]
        cold = [r.tokens for r in autoregressive_generate(cpu.target, shared)]
        results = [engine.generate([r])[0] for r in shared]
        assert [r.tokens for r in results] == cold
        assert results[-1].cached_tokens > 0
        apply_draft_vocab(fake, 64)
        try:
            assert engine_tokens(fake, requests) == expected
        finally:
            apply_draft_vocab(fake, None)


# --- the verify op's dispatch ---------------------------------------------------------------------------------------

def stand_in_op(logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id):
    """dflash_verify::verify_block as plugins/dflash_verify/torch/verify_op.cpp checks its inputs, computing with
    the torch reference on the CPU tensors (one kernel launch: no host sync)."""
    from dflash_trt.decoding import verify as reference
    from dflash_trt.kernels.verify import next_block_ids

    tensors = (logits, drafts, start, temperature, top_k, top_p, seed)
    assert logits.is_cuda and logits.dim() == 3 and logits.dtype in (torch.float32, torch.float16, torch.bfloat16)
    b, width, _ = logits.shape
    assert drafts.shape == (b, width - 1) and drafts.dtype in (torch.int32, torch.int64)
    assert start.dtype == seed.dtype == torch.int64 and temperature.dtype == top_p.dtype == torch.float32
    assert all(t.shape == (b,) for t in (start, temperature, top_k, top_p, seed))
    assert all(t.device == logits.device and t.is_contiguous() for t in tensors)
    def run():  # plain CPU tensors: nothing counted
        tokens, accepted = reference.verify_block(*(t.elem for t in tensors))
        return tokens, accepted, next_block_ids(tokens, accepted, mask_token_id)

    out = tuple(FakeCuda(t) for t in run())
    taped(run, out)  # one kernel launch: a CUDA graph replays it
    return out


@contextlib.contextmanager
def with_stand_in_op():
    with mock.patch("dflash_trt.kernels.verify.load_op", lambda: stand_in_op), \
            mock.patch("dflash_trt.kernels.verify.kernel_available", lambda: True):
        yield


@pytest.mark.parametrize("temperature", [0.0, pytest.param(1.0, marks=SLOW)])
def test_the_kernel_dispatch_on_cuda_gives_the_reference_tokens(pairs, temperature):
    from dflash_trt.kernels import select

    cpu, fake = pairs["fp32"]
    requests = agent_requests(temperature)
    expected = [r.tokens for r in autoregressive_generate(cpu.target, requests)]
    with fake_cuda(), with_stand_in_op():
        assert select(fake.target.lm_head.weight.device).name == "kernel"
        assert engine_tokens(fake, requests) == expected


# --- host syncs ---------------------------------------------------------------------------------------------------

class Regions:
    """Wraps a scheduler's decode step and its runners' draft and verify passes to count syncs per step, and those
    from the start of the draft pass to the end of the verify pass (what a CUDA graph would capture)."""

    def __init__(self, engine):
        self.per_step: list[int] = []
        scheduler = engine.scheduler
        decode, propose, verify = scheduler._decode, scheduler.draft.propose, scheduler.target.verify

        def step(*a, **k):
            before = SYNCS.total
            out = decode(*a, **k)
            self.per_step.append(SYNCS.total - before)
            return out

        def in_region(call):
            def run(*a, **k):
                with SYNCS.region():
                    return call(*a, **k)
            return run

        scheduler._decode = step
        scheduler.draft.propose, scheduler.target.verify = in_region(propose), in_region(verify)


@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=SLOW)])
@pytest.mark.parametrize("temperature", [0.0, pytest.param(1.0, marks=SLOW)])
def test_a_decode_step_on_cuda_reads_the_device_once_and_never_between_draft_and_verify(pairs, dtype, temperature):
    _, fake = pairs[dtype]
    requests = agent_requests(temperature, n=3, new=32)
    with fake_cuda() as syncs, with_stand_in_op():
        engine = local_engine(fake, 80, width_policy="schedule", max_batch_size=3)
        regions = Regions(engine)
        engine.generate(requests)
    assert len(regions.per_step) > 5
    assert max(regions.per_step) <= STEP_SYNC_BUDGET, syncs.table()
    assert not syncs.in_region, syncs.table(syncs.in_region)
    assert max(regions.per_step) == 1  # the accepted counts and tokens, read together


def test_the_sync_free_sampling_rule_picks_the_same_tokens(make_requests):
    """On a GPU the rule computes every row and column (no nonzero, no reads); on the CPU it skips what cannot win:
    the same tokens, over every top-k / top-p variant, flat and peaked rows, ties and non-finite logits."""
    from conftest import VARIANTS

    from dflash_trt.decoding.sampling import sample_tokens_reference

    torch.manual_seed(3)
    n, vocab = 60, 4096
    logits = torch.randn(n, vocab) * torch.linspace(0.1, 12.0, n)[:, None]
    logits[5, :100] = logits[5].max() + 1.0  # a tie at the top
    logits[6, 7] = float("nan")
    logits[7, 9] = float("inf")
    temperature = torch.tensor([[0.0, 0.7, 1.0, 1.5][i % 4] for i in range(n)], dtype=torch.float32)
    top_k = torch.tensor([VARIANTS[i % len(VARIANTS)][0] for i in range(n)])
    top_p = torch.tensor([VARIANTS[i % len(VARIANTS)][1] for i in range(n)], dtype=torch.float32)
    seed, positions = torch.arange(n) * 7919 - 10**12, torch.arange(n) + 100
    args = (logits, positions, temperature, top_k, top_p, seed)
    expected = sample_tokens_reference(*args)
    with fake_cuda() as syncs:
        got = sample_tokens_reference(*(a.to("cuda", non_blocking=True) for a in args))
        assert syncs.total == 0, syncs.table()
        got = got.cpu()
    assert torch.equal(got, expected)


# --- CUDA graphs ----------------------------------------------------------------------------------------------------

def test_a_fake_graph_replays_the_captured_calls_on_new_inputs_and_refuses_syncs():
    from dflash_trt.backends.torch.graphs import PassGraphs

    with fake_cuda():
        weight = torch.randn(4, 4).to("cuda")
        graphs = PassGraphs()
        fn = lambda x: ((x @ weight).relu().sum(0),)  # noqa: E731
        for step in range(4):
            x = torch.randn(3, 4)
            (got,) = graphs.run("k", fn, (x.to("cuda", non_blocking=True),))
            assert torch.equal(got.cpu(), (x @ weight.cpu()).relu().sum(0))
        assert graphs.replays == 3 and len(graphs.graphs) == 1
        with pytest.raises(DeviceError, match="during CUDA graph capture"):
            for _ in range(2):
                graphs.run("syncs", lambda x: (x * int(x.sum() > 0),), (torch.zeros(2, device="cuda"),))


@pytest.mark.parametrize("temperature", [0.0, pytest.param(1.0, marks=SLOW)])
def test_cuda_graphs_give_the_eager_tokens(pairs, temperature):
    """Ragged requests finishing at different steps (new slot sets, narrowing last blocks, growing contexts): both
    passes replay from graphs and give plain AR's tokens."""
    cpu, fake = pairs["fp32"]
    requests = [Request(tuple(range(40 + i, 60 + 9 * i)), SamplingParams(temperature, seed=7 + i),
                        StopCriteria(20 + 11 * i)) for i in range(3)]
    expected = [r.tokens for r in autoregressive_generate(cpu.target, requests)]
    with fake_cuda():
        runs = {}
        for graphs in (False, True):
            engine = local_engine(fake, 96, width_policy="schedule", max_batch_size=3, cuda_graphs=graphs)
            runs[graphs] = [r.tokens for r in engine.generate(requests)]
        target, draft = engine.scheduler.target.graphs, engine.scheduler.draft.graphs
    assert runs[False] == runs[True] == expected
    assert target.replays > 10 and draft.replays > 10
    assert len(target.graphs) >= 2  # a set of slots per stage of the batch


@SLOW
def test_gpu_lossless_compares_eager_and_graphs_on_cuda(pairs):
    """scripts/gpu_lossless.py --cuda-graphs compare, as gpu_check.sh runs it on a GPU: one cell on fake CUDA."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_lossless.py"
    spec = importlib.util.spec_from_file_location("gpu_lossless", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    _, fake = pairs["fp32"]
    with fake_cuda():
        row = script.graphs_cell(fake, [list(range(40, 60)), list(range(70, 83))], 2, 0.0, 16)
    assert row["identical"] and row["first_divergence"] is None
    assert row["verify_replays"] > 0 and row["eager_tokens_per_s"] > 0 and row["graphs_tokens_per_s"] > 0
