"""The CUDA verification kernel on a GPU, through its torch op: bit-identical to the CPU twin and the
torch reference for every logits dtype and sampling mode at the full vocabulary, adversarial rows, CUDA-graph
capture. Skipped cleanly where no kernel is built (every CPU machine); `scripts/gpu_check.sh` runs them on a
lent GPU."""

from __future__ import annotations

import pytest
import torch
from verify_rows import NAN, NEG_INF, params, random_rows

from dflash_trt.decoding.verify import verify_block
from dflash_trt.kernels import twin
from dflash_trt.kernels import verify as dispatch

FULL_VOCAB = 151936  # Qwen3's vocabulary: the rows the presets verify
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = {  # (temperature, top_k, top_p): each branch of the sampling rule (include/dflash_verify/row_select.h)
    "greedy": (0.0, 0, 1.0),
    "sampled": (0.8, 0, 1.0),
    "top_k": (0.8, 50, 1.0),
    "top_p": (0.8, 0, 0.9),
    "top_k_top_p": (0.8, 50, 0.9),
}


def _need_kernel():
    if not dispatch.kernel_available():
        pytest.skip(f"verify kernel not available: {dispatch.kernel_status()}")


def full_vocab_block(dtype: torch.dtype, mode: str, b: int = 4, k: int = 3) -> tuple[list, torch.Tensor]:
    """One deterministic verify call at V = 151936 (CPU tensors) and the acceptance length each row must get.

    Rows 0-1 are LLM-like (64 large logits over a Gaussian floor), row 2 is flat (thousands of tokens at the
    top-p edge), row 3 is all ties; row i's drafts match the target's tokens up to slot i (acceptance 0..K)."""
    g = torch.Generator().manual_seed(FULL_VOCAB)
    logits = torch.randn(b, k + 1, FULL_VOCAB, generator=g) * 2  # [B, K+1, V]
    logits[:, :, :64] += 8
    logits[2] = torch.randn(k + 1, FULL_VOCAB, generator=g) * 0.05
    logits[3] = logits[3].round()
    _, temperature, top_k, top_p, _ = params(b, *MODES[mode])
    start = torch.arange(b, dtype=torch.int64) * 1000 + 17
    seed = torch.randint(-2**63, 2**63 - 1, (b,), generator=g)
    args = [logits.to(dtype), torch.zeros(b, k, dtype=torch.int64), start, temperature, top_k, top_p, seed]
    drafts = verify_block(*args)[0][:, :k].clone()  # [B, K]: the target's own tokens ...
    cut = torch.arange(b) % (k + 1)
    rows = (cut < k).nonzero().flatten()
    drafts[rows, cut[rows]] = (drafts[rows, cut[rows]] + 1) % FULL_VOCAB  # ... until slot cut[i]
    args[1] = drafts
    return args, cut


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_matches_twin_and_reference_at_full_vocab(dtype, mode):
    """kernel == twin == reference (run on CUDA) for each dtype and sampling mode at V = 151936, top-p
    included: all three use the same fixed-point top-p masses."""
    _need_kernel()
    args, cut = full_vocab_block(DTYPES[dtype], mode)
    cuda = [a.cuda() for a in args]
    got = [t.cpu() for t in dispatch.load_op()(*cuda, 5)]
    for name, mine, want in zip(("tokens", "accepted", "next_block_ids"), got, twin.verify_block_next(*args, 5)):
        assert torch.equal(mine, want), name
    assert torch.equal(got[1], cut)
    want_tokens, want_accepted = verify_block(*cuda)
    assert torch.equal(got[0], want_tokens.cpu()) and torch.equal(got[1], want_accepted.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,b,k", [(1, 16, 15), (7, 16, 15), (1000, 16, 15), (32003, 8, 3), (151936, 4, 3)])
def test_kernel_matches_twin_and_reference_on_random_rows(vocab, b, k, dtype):
    """Random rows (ties, -inf, NaN, random T / top-k / top-p per row): kernel == twin == reference."""
    _need_kernel()
    g = torch.Generator().manual_seed(vocab)
    logits, _, temperature, top_k, top_p, seed = random_rows(g, b * (k + 1), vocab, DTYPES[dtype])
    logits = logits.view(b, k + 1, vocab)
    per_row = lambda t: t.view(b, k + 1)[:, 0].contiguous()  # noqa: E731
    args = [logits, torch.randint(0, vocab, (b, k), generator=g), torch.randint(0, 2**40, (b,), generator=g),
            *map(per_row, (temperature, top_k, top_p, seed))]
    cuda = [a.cuda() for a in args]
    tokens, accepted, next_ids = (t.cpu() for t in dispatch.load_op()(*cuda, 5))
    for got, want in zip((tokens, accepted, next_ids), twin.verify_block_next(*args, 5)):
        assert torch.equal(got, want)
    want_tokens, _ = verify_block(*cuda)
    assert torch.equal(tokens, want_tokens.cpu())


@pytest.mark.gpu
def test_kernel_adversarial_rows_match_reference():
    _need_kernel()
    rows = torch.tensor([[NAN] * 6, [NAN, NEG_INF, NAN, NEG_INF, 1.0, 1.0], [NEG_INF] * 6, [0.0] * 6])
    for temperature, top_k, top_p in [(0.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 2, 1.0), (1.0, 0, 0.3), (1.0, 0, 0.0)]:
        args = [rows[:, None, :].contiguous(), torch.zeros(4, 0, dtype=torch.int64), *params(4, temperature, top_k,
                top_p, seed=2**64 - 3)]
        got = dispatch.load_op()(*[a.cuda() for a in args], 0)[0].cpu()
        assert torch.equal(got, verify_block(*args)[0])


@pytest.mark.gpu
def test_kernel_is_capturable_in_a_cuda_graph():
    _need_kernel()
    args = [a.cuda() for a in (torch.randn(2, 4, 1000), torch.zeros(2, 3, dtype=torch.int64), *params(2, 0.7, 20, 0.9))]
    op = dispatch.load_op()
    eager = op(*args, 1)[0]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*args, 1)[0]
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
