"""`linear` (the small-row CPU path) equals F.linear; `call_linear` keeps hooks and special modules."""

import torch
from torch import nn
from torch.nn import functional as F

from dflash_trt.model import layers
from dflash_trt.model.layers import call_linear, linear


def test_linear_equals_f_linear_for_every_row_count_and_shape():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 48, generator=g)
    for shape in [(1, 48), (2, 48), (3, 48), (4, 48), (5, 48), (1, 4, 48), (2, 2, 48), (1, 1, 3, 48), (4, 1, 48)]:
        x = torch.randn(*shape, generator=g)
        got, want = linear(x, w), F.linear(x, w)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    x = torch.randn(3, 48, generator=g)[:, ::2].repeat(1, 2)  # non-contiguous input
    torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_small_row_path_is_taken_and_differentiable(monkeypatch):
    calls = []
    mm = torch.mm
    monkeypatch.setattr(layers.torch, "mm", lambda a, b: calls.append(a.shape) or mm(a, b))
    w = torch.randn(8, 6, requires_grad=True)
    x = torch.randn(3, 6, requires_grad=True)
    linear(x, w).sum().backward()
    assert calls == [(8, 6)]  # W @ xᵀ: the weight is the streamed operand
    torch.testing.assert_close(w.grad, x.detach().sum(0).expand(8, -1))
    linear(torch.randn(1, 6), w)
    linear(torch.randn(9, 6), w)
    assert len(calls) == 1  # one row (GEMV) and many rows keep F.linear


def test_call_linear_keeps_hooks_and_other_modules():
    lin = nn.Linear(6, 4, bias=False)
    x = torch.randn(3, 6)
    torch.testing.assert_close(call_linear(lin, x), lin(x))
    seen = []
    lin.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape))
    call_linear(lin, x)
    assert seen == [(3, 6)]

    class Scaled(nn.Linear):
        def forward(self, inp):
            return 2 * super().forward(inp)

    scaled = Scaled(6, 4, bias=False)
    torch.testing.assert_close(call_linear(scaled, x), 2 * F.linear(x, scaled.weight))
