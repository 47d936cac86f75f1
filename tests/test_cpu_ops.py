"""The C++ CPU library's row-independent ops (backends/cpu/ops.py) against torch: projections (plain and
packed panels), RMSNorm, the greedy heads; every row computed as it would be alone."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dflash_trt.backends.cpu import ops as cpu_ops
from dflash_trt.backends.cpu.target import verify_lazily
from dflash_trt.decoding.drafts import confident_drafts
from dflash_trt.decoding.verify import verify_block as reference_verify


@pytest.mark.parametrize("rows,k,n", [(1, 64, 96), (2, 48, 33), (3, 20, 7), (5, 37, 11), (9, 200, 64), (16, 512, 3)])
def test_matmul_equals_f_linear_and_rows_are_independent(rows, k, n):
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    out = cpu_ops.matmul_nt(x, w)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)
    for t in range(rows):
        assert torch.equal(cpu_ops.matmul_nt(x[t : t + 1].contiguous(), w)[0], out[t])


@pytest.mark.parametrize("rows,k,n", [(1, 64, 96), (2, 48, 33), (3, 20, 7), (5, 37, 16), (7, 64, 57), (8, 192, 40),
                                      (9, 200, 65), (16, 512, 3), (300, 24, 50)])
def test_panel_matmul_equals_f_linear_and_rows_are_independent(rows, k, n):
    """The layer's projections: weights packed in panels of 8 outputs, tiles of up to 8 rows (any row count)."""
    lib = cpu_ops.library()
    g = torch.Generator().manual_seed(rows + 100)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    panels = cpu_ops.pack_panels(w)
    assert panels.shape == ((n + 7) // 8, k, 8)

    def matmul(inp):
        out = torch.empty(inp.shape[0], n)
        lib.dfl_matmul_panels(inp.data_ptr(), inp.shape[0], k, panels.data_ptr(), n, out.data_ptr())
        return out

    out = matmul(x)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)
    for t in range(rows):
        assert torch.equal(matmul(x[t : t + 1].contiguous())[0], out[t])


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(cpu_ops.ENV, "0")
    cpu_ops.library.cache_clear()
    try:
        assert cpu_ops.library() is None
    finally:
        monkeypatch.delenv(cpu_ops.ENV)
        cpu_ops.library.cache_clear()
    assert cpu_ops.library() is not None


def _python_path(fn):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu_ops, "library", lambda: None)
        return fn()


def _head_and_rows(seed: int, vocab: int):
    """A random bias-free head (its scale ranging with `seed`) and one sequence's rows -> (generator, head,
    hidden [1, width, 24], width)."""
    g = torch.Generator().manual_seed(seed)
    hidden_size, width = 24, 2 + seed % 15
    head = nn.Linear(hidden_size, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden_size, generator=g) * (0.5 + seed % 4))
    return g, head, torch.randn(1, width, hidden_size, generator=g), width


def _drafts_with_a_mismatch(tokens: torch.Tensor, g, width: int, vocab: int) -> tuple[torch.Tensor, int]:
    """drafts [1, width - 1] = `tokens` [width - 1] but one, changed at a random slot (none when it falls past
    the block) -> (drafts, that slot)."""
    drafts = tokens[None].clone()
    cut = int(torch.randint(0, width, (1,), generator=g))
    if cut < width - 1:
        drafts[0, cut] = (drafts[0, cut] + 1) % vocab
    return drafts, cut


@pytest.mark.parametrize("seed", range(40))
def test_greedy_heads_equal_the_torch_rules(seed):
    """verify_lazily (temperature 0) and confident_drafts for one sequence, C++ vs torch."""
    vocab = 50 + seed
    g, head, hidden, width = _head_and_rows(seed, vocab)
    sampling = (torch.zeros(1), torch.zeros(1, dtype=torch.int64), torch.ones(1), torch.zeros(1, dtype=torch.int64))
    with torch.inference_mode():
        truth = F.linear(hidden, head.weight).argmax(-1)
        drafts, _ = _drafts_with_a_mismatch(truth[0, 1:], g, width, vocab)
        got = verify_lazily(hidden, head, drafts, torch.tensor([7]), sampling, reference_verify, twin=False)
        want = _python_path(lambda: verify_lazily(hidden, head, drafts, torch.tensor([7]), sampling, reference_verify,
                                                  twin=False))
        a = int(want[1][0])
        assert int(got[1][0]) == a and torch.equal(got[0][0, : a + 1], want[0][0, : a + 1])
        for min_confidence in (0.0, 0.02, 0.3):
            logits_of = lambda lo, hi: F.linear(hidden[:, lo:hi], head.weight)
            want = confident_drafts(logits_of, width, min_confidence)
            got = cpu_ops.greedy_drafts(hidden[0], head, min_confidence, 6)
            assert torch.equal(got, want[0]), (min_confidence, got, want)


@pytest.mark.parametrize("seed", range(24))
def test_sampled_verify_equals_the_lazy_torch_rule(seed, monkeypatch):
    """verify_lazily at temperature > 0 for one sequence: the C++ verify (head chunks 2, 2, 4, ..., the
    twin's rule by pointer) commits the tokens and accepted count of the chunked torch loop through the
    kernels' CPU bodies (the twin), at several temperatures, with top-k / top-p, the mismatch anywhere."""
    from dflash_trt.kernels import select

    kernels = select("cpu")
    assert kernels.name == "twin"
    sample_tokens, verify_block = kernels.sample_tokens, kernels.verify_block

    vocab = 60 + seed
    g, head, hidden, width = _head_and_rows(seed, vocab)
    sampling = (torch.tensor([(0.5, 1.0, 1.7)[seed % 3]]), torch.tensor([(0, 7)[seed % 2]]),
                torch.tensor([(1.0, 0.8)[seed // 2 % 2]]), torch.tensor([seed * 1000 + 3]))
    start = torch.tensor([11 + seed])
    calls = []
    real = cpu_ops.sampled_verify
    monkeypatch.setattr(cpu_ops, "sampled_verify", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        logits = F.linear(hidden[0], head.weight)
        positions = start + 1 + torch.arange(width)
        truth = sample_tokens(cpu_ops.head_matmul(hidden[0].contiguous(), head), positions,
                              *(x.repeat(width) for x in sampling))
        drafts, cut = _drafts_with_a_mismatch(truth[:-1], g, width, vocab)
        got = verify_lazily(hidden, head, drafts, start, sampling, verify_block, twin=True)
        with pytest.MonkeyPatch.context() as m:  # the chunked torch loop (the same head panels, the same bodies)
            m.setattr(cpu_ops, "head_ready", lambda *a: False)
            want = verify_lazily(hidden, head, drafts, start, sampling, verify_block, twin=True)
    a = int(want[1][0])
    assert calls == [1] and logits.shape == (width, vocab)
    assert int(got[1][0]) == a == min(cut, width - 1) and torch.equal(got[0][0, : a + 1], want[0][0, : a + 1])
    assert torch.equal(got[0][0, : a + 1], truth[: a + 1])


def test_rms_norm_equals_torch_and_steps_aside_for_autograd():
    from dflash_trt.model.layers import RMSNorm

    norm = RMSNorm(40, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(40, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(3, 5, 40, generator=torch.Generator().manual_seed(1))
    want = F.rms_norm(x, (40,), norm.weight, 1e-6)
    with torch.inference_mode():
        got = cpu_ops.rms_norm(x, norm.weight.detach(), 1e-6)
        torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=1e-6)
    assert cpu_ops.rms_norm(x, norm.weight, 1e-6) is None  # autograd on: the torch op


def test_head_panels_follow_in_place_changes():
    head = nn.Linear(16, 40, bias=False)
    hidden = torch.randn(5, 16, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        first = cpu_ops.greedy_drafts(hidden, head, 0.0, 6)
        assert torch.equal(first, F.linear(hidden, head.weight).argmax(-1))
        with torch.no_grad():
            head.weight.neg_()
        again = cpu_ops.greedy_drafts(hidden, head, 0.0, 6)
        assert torch.equal(again, F.linear(hidden, head.weight).argmax(-1)) and not torch.equal(again, first)


def test_inference_tensor_heads_work():
    """A head built inside inference mode (a draft vocabulary selected there) has no version counter."""
    with torch.inference_mode():
        weight = torch.randn(30, 16)
        head = type("Head", (), {})()
        head.weight = weight
        hidden = torch.randn(3, 16)
        assert torch.equal(cpu_ops.greedy_drafts(hidden, head, 0.0, 6), F.linear(hidden, weight).argmax(-1))
