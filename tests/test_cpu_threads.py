"""The C++ CPU passes on several threads (backends/cpu: dfl_set_threads) give the bits of one thread: layer
passes, the one-call draft step and the lazy verify, on shapes whose panel chunks split unevenly, with more
threads than cores, and with two host threads calling in at once."""

import threading

import pytest
import torch
from tiny_models import make_target

from dflash_trt.backends.cpu import draft as cpu_draft
from dflash_trt.backends.cpu import ops as cpu_ops
from dflash_trt.backends.cpu import target as cpu_target
from dflash_trt.backends.cpu.target import verify_lazily
from dflash_trt.checkpoint.hf import read_target
from dflash_trt.decoding.verify import verify_block as reference_verify
from dflash_trt.kernels import select
from dflash_trt.model.loader import cpu_threads, load_target

THREADS = (1, 2, 3)  # 3: more threads than the CI machine's cores, every chunk count split unevenly
TAPS = (0, 1, 2)


@pytest.fixture(scope="module")
def odd_target(tmp_path_factory):
    """fp32 panels whose projections split into uneven chunks of 6 panels (q/k/v 24 panels, gate/up 75,
    down 17, a head of 125), each above the C++ split threshold at a few rows."""
    folder = tmp_path_factory.mktemp("odd_target")
    make_target(folder, "qwen3", seed=7, hidden_size=136, intermediate_size=300, head_dim=24, vocab_size=1000,
                num_hidden_layers=3)
    return load_target(read_target(folder))


@pytest.fixture(params=["odd_fp32", "shipped_bf16"])
def any_target(request, odd_target, shipped_pair):
    return odd_target if request.param == "odd_fp32" else shipped_pair.target


def decode(model, tokens: torch.Tensor, prefill: int, widths: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Prefill, then blocks of `widths` rows in turn -> (logits, taps, K cache, V cache) of every row."""
    cache, slots = model.new_cache(1, 96), torch.tensor([0])
    with torch.inference_mode():
        logits, taps = cpu_target.forward(model, tokens[:, :prefill], torch.arange(prefill)[None], cache, slots, TAPS)
        outs, pos, i = [(logits, taps)], prefill, 0
        while pos < tokens.shape[1]:
            n = min(widths[i % len(widths)], tokens.shape[1] - pos)
            outs.append(cpu_target.forward(model, tokens[:, pos : pos + n], torch.arange(pos, pos + n)[None], cache,
                                           slots, TAPS))
            pos, i = pos + n, i + 1
    end = tokens.shape[1]
    return (torch.cat([o[0] for o in outs], 1), torch.cat([o[1] for o in outs], 1), cache.k[:, 0, :, :end].clone(),
            cache.v[:, 0, :, :end].clone())


def at_each_thread_count(fn) -> dict[int, object]:
    """fn() at every count of THREADS; checks that the counts above one handed work to the pool."""
    lib, out = cpu_ops.library(), {}
    for n in THREADS:
        jobs = lib.dfl_pool_jobs()
        with cpu_ops.threads(n):
            out[n] = fn()
        assert (lib.dfl_pool_jobs() > jobs) == (n > 1), n
    return out


def assert_same_bits(results: dict[int, object]) -> None:
    one = results[1]
    for n, got in results.items():
        for a, b in zip(got if isinstance(got, tuple) else (got,), one if isinstance(one, tuple) else (one,)):
            assert torch.equal(a, b), n


def test_layer_passes_are_the_same_bits_at_any_thread_count(any_target):
    vocab = any_target.config.vocab_size
    tokens = torch.randint(0, vocab, (1, 64), generator=torch.Generator().manual_seed(0))
    assert_same_bits(at_each_thread_count(lambda: decode(any_target, tokens, 37, (1, 3, 8, 2))))


def test_head_logits_and_lazy_verify_are_the_same_bits_at_any_thread_count(odd_target):
    """The head over 125 panels (chunks 6, ..., 6, 5), greedy and sampled verify_lazily (the row's argmax or
    the twin's pick after the split head)."""
    head, kernels = odd_target.lm_head, select("cpu")
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 12, odd_target.config.dims.hidden_size, generator=g)
    with torch.inference_mode():
        truth = cpu_ops.head_matmul(hidden[0].contiguous(), head).argmax(-1)
    drafts = truth[None, :-1].clone()  # row r predicts draft r + 1
    drafts[0, 7] = (drafts[0, 7] + 1) % odd_target.config.vocab_size  # a mismatch past the first chunks
    greedy = (torch.zeros(1), torch.zeros(1, dtype=torch.int64), torch.ones(1), torch.zeros(1, dtype=torch.int64))
    sampled = (torch.tensor([0.8]), torch.tensor([0]), torch.tensor([0.95]), torch.tensor([123]))

    def run():
        with torch.inference_mode():
            logits = cpu_ops.head_matmul(hidden[0].contiguous(), head)
            tokens, accepted = verify_lazily(hidden, head, drafts, torch.tensor([30]), greedy, reference_verify,
                                             twin=False)
            s_tokens, s_accepted = verify_lazily(hidden, head, drafts, torch.tensor([30]), sampled,
                                                 kernels.verify_block, twin=True)
        return logits, tokens, accepted, s_tokens, s_accepted

    results = at_each_thread_count(run)
    assert int(results[1][2][0]) == 7  # the greedy verify read past the first chunks
    assert_same_bits(results)


@pytest.mark.parametrize("min_confidence", [0.0, 0.1])
@pytest.mark.parametrize("sampled", [False, True])
def test_one_call_draft_step_is_the_same_bits_at_any_thread_count(shipped_pair, min_confidence, sampled):
    """The shipped drafter's draft step (context features, both layers, the confidence cut over the target's
    head): the same drafts and draft K/V at every thread count."""
    draft, target = shipped_pair.draft, shipped_pair.target
    q = draft.config.block_size
    g = torch.Generator().manual_seed(2)
    n_taps = len(draft.config.target_layer_ids) * target.config.dims.hidden_size
    target_hidden = torch.randn(1, 30, n_taps, generator=g)
    block = target.embed(torch.cat([torch.tensor([[17]]), torch.full((1, q - 1), draft.config.mask_token_id)], 1))
    sampling = (torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([5])) if sampled else None
    sample = select("cpu").sample_tokens

    def run():
        cache, slots = draft.new_cache(2, 64), torch.tensor([1])
        with torch.inference_mode():
            draft.append_context(target_hidden[:, :24], torch.arange(24)[None], cache, slots)
            context = (target_hidden[:, 24:], torch.arange(24, 30)[None], None)
            drafts = cpu_draft.draft_block(draft, block, torch.arange(30, 30 + q)[None], cache, slots, context,
                                           target.lm_head, min_confidence, sampling, None, sample, twin=True)
        return drafts, cache.k[:, 1, :, : 30 + q].clone(), cache.v[:, 1, :, : 30 + q].clone()

    assert_same_bits(at_each_thread_count(run))


def test_small_projections_stay_on_the_calling_thread():
    """A projection under the split threshold is not handed to the pool (it would pay the hand-off for
    microseconds of work); the same weights over more rows are."""
    lib = cpu_ops.library()
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 16, generator=g)  # 8 panels: two chunks, 1024 multiply-adds a row
    panels = cpu_ops.pack_panels(w)

    def jobs_for(rows: int) -> int:
        x, out = torch.randn(rows, 16, generator=g), torch.empty(rows, 64)
        with cpu_ops.threads(2):
            before = lib.dfl_pool_jobs()
            lib.dfl_matmul_panels(x.data_ptr(), rows, 16, panels.data_ptr(), 64, out.data_ptr())
            torch.testing.assert_close(out, x @ w.T, rtol=1e-5, atol=1e-5)
            return lib.dfl_pool_jobs() - before

    assert jobs_for(1) == 0
    assert jobs_for(64) == 1


def test_two_host_threads_calling_at_once_get_their_own_bits(odd_target):
    """Passes from two Python threads at once (ctypes lets both into the library): one runs on the pool, the
    other alone, and each gets the bits of a pass on its own."""
    tokens = torch.randint(0, 1000, (2, 40), generator=torch.Generator().manual_seed(3))
    want = [decode(odd_target, tokens[i : i + 1], 20, (4,)) for i in range(2)]
    got = [None, None]

    def worker(i):
        got[i] = [decode(odd_target, tokens[i : i + 1], 20, (4,)) for _ in range(3)]

    with cpu_ops.threads(2):
        callers = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
    for i in range(2):
        for run in got[i]:
            assert_same_bits({1: want[i], 2: run})


def test_passes_follow_torch_threads_capped_by_the_environment(odd_target, monkeypatch):
    """The library runs min(DFLASH_TRT_CPU_THREADS, torch's intra-op threads): a pass after
    torch.set_num_threads (the runtime's resolve_device, a TP rank's 1) picks the new count up."""
    lib, before = cpu_ops.library(), torch.get_num_threads()
    tokens = torch.randint(0, 1000, (1, 4), generator=torch.Generator().manual_seed(4))
    try:
        with monkeypatch.context() as m:
            m.setenv("DFLASH_TRT_CPU_THREADS", "2")
            for torch_threads, expected in ((1, 1), (3, 2), (2, 2), (1, 1)):
                torch.set_num_threads(torch_threads)
                decode(odd_target, tokens, 4, (1,))
                assert lib.dfl_threads() == expected, torch_threads
    finally:
        torch.set_num_threads(before)
    cpu_ops.follow_torch_threads(lib)
    assert lib.dfl_threads() == min(cpu_threads(), before)
