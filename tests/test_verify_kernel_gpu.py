"""The CUDA verification kernel on a GPU, through its torch op: bit-identical to the CPU twin and the
torch reference, adversarial rows, CUDA-graph capture. Skipped cleanly where no kernel is built
(every CPU machine); `scripts/gpu_check.sh` runs them on a lent GPU."""

from __future__ import annotations

import pytest
import torch
from verify_rows import NAN, NEG_INF, params, random_rows

from dflash_trt.decoding.verify import verify_block
from dflash_trt.kernels import twin
from dflash_trt.kernels import verify as dispatch


def _need_kernel():
    if not dispatch.kernel_available():
        pytest.skip(f"verify kernel not available: {dispatch.kernel_status()}")


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,b,k", [(1, 16, 15), (7, 16, 15), (1000, 16, 15), (32003, 8, 3), (151936, 4, 3)])
def test_kernel_matches_twin_and_reference_exactly(vocab, b, k):
    """kernel == twin == reference (run on CUDA) on every row, top-p included: all three use the
    same fixed-point top-p masses."""
    _need_kernel()
    g = torch.Generator().manual_seed(vocab)
    logits, _, temperature, top_k, top_p, seed = random_rows(g, b * (k + 1), vocab)
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
