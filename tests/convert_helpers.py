"""Checkpoint-conversion helpers shared by the convert / quant / TP tests (not a test module)."""

import torch

from dflash_trt.checkpoint.quant import numerics as nq
from dflash_trt.convert import ConvertConfig, convert


def run_convert(target, draft, out, **kw):
    kw = {"dtype": "fp32", "calibrator": "builtin", "calib_samples": 4, "calib_seq_len": 16,
          "calib_new_tokens": 8} | kw
    config = ConvertConfig(str(target), str(draft), str(out), **kw)
    convert(config)
    return config


def with_random_biases(hf, folder, seed=0):
    """HF initializes biases to zero, which would hide a bias added twice or dropped; re-save random ones."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    hf.save_pretrained(folder)
    return hf


def fp8_bound(w, scale):
    """e4m3: half an ulp (2^-4 relative) in the normal range, 2^-10 * scale among subnormals."""
    return torch.maximum(w.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)


def nvfp4_bound(w, block_scales, global_scale):
    """Half the e2m1 gap around |w| / s, or the overshoot past 6 when the block scale rounded down."""
    s = (block_scales.float() * global_scale).repeat_interleave(nq.NVFP4_BLOCK, dim=-1)
    y = w.abs() / s
    half_gap = torch.where(y < 2, 0.25, torch.where(y < 4, 0.5, 1.0))
    return s * torch.maximum(half_gap, y - 6) * (1 + 1e-6)
