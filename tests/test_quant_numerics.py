"""FP8 / NVFP4 primitives: error bounds, packing, and byte-for-byte agreement with Model Optimizer."""

import pytest
import torch
from convert_helpers import fp8_bound, nvfp4_bound

from dflash_trt.checkpoint.quant import numerics as nq
from dflash_trt.checkpoint.quant.modes import HANDLERS, get_handler, kv_cache_scale
from dflash_trt.errors import ConfigError

mo_qtensor = pytest.importorskip("modelopt.torch.quantization.qtensor")
mo_tensor_quant = pytest.importorskip("modelopt.torch.quantization.tensor_quant")
pytestmark = pytest.mark.usefixtures("one_thread")

TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -2.5, 6.0, 7.0, 0.1, -0.0, 0.0, 3.0, -5.0]


def _weights(dtype=torch.float32) -> torch.Tensor:
    """[64, 128] with mixed magnitudes, an all-zero block and e2m1 tie values in one block."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g) * torch.logspace(-3, 0, 64)[:, None]
    w[3, :16] = 0
    w[5, :16] = torch.tensor(TIES) / 7.0 * w[5].abs().max()
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_round_trip_within_half_ulp(dtype):
    w = _weights(dtype)
    scale = nq.fp8_scale(nq.tensor_amax(w))
    err = (nq.fp8_dequantize(nq.fp8_quantize(w, scale), scale) - w.float()).abs()
    assert (err <= fp8_bound(w.float(), scale)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_round_trip_within_e2m1_bound(dtype):
    w = _weights(dtype)
    gs = nq.nvfp4_global_scale(nq.tensor_amax(w))
    packed, block_scales = nq.nvfp4_quantize(w, gs)
    err = (nq.nvfp4_dequantize(packed, block_scales, gs) - w.float()).abs()
    assert (err <= nvfp4_bound(w.float(), block_scales, gs)).all()
    assert err.norm() / w.float().norm() < 0.15


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_weight_bytes_match_modelopt_export(dtype):
    """Model Optimizer's checkpoint export: weight / (amax.float() / 448) cast to e4m3."""
    from modelopt.torch.export.quant_utils import QUANTIZATION_FP8, to_quantized_weight

    w = _weights(dtype)
    scale = w.abs().amax().float() / 448.0  # modelopt get_scaling_factor
    theirs = to_quantized_weight(w, scale.reshape(1), QUANTIZATION_FP8)
    ours_scale = nq.fp8_scale(nq.tensor_amax(w))
    assert torch.equal(ours_scale, scale)
    assert torch.equal(nq.fp8_quantize(w, ours_scale).view(torch.uint8), theirs.view(torch.uint8))
    if dtype == torch.float32:  # the tensor class agrees too (it keeps scales in the input dtype)
        qtensor, _ = mo_qtensor.FP8QTensor.quantize(w)
        assert torch.equal(nq.fp8_quantize(w, ours_scale).view(torch.uint8), qtensor._quantized_data.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_packing_and_scales_bit_identical_to_modelopt(dtype):
    w = _weights(dtype)
    qtensor, block_scales, global_scale = mo_qtensor.NVFP4QTensor.quantize(w, nq.NVFP4_BLOCK)
    gs = nq.nvfp4_global_scale(nq.tensor_amax(w))
    packed, ours_scales = nq.nvfp4_quantize(w, gs)
    assert packed.dtype == torch.uint8 and packed.shape == (64, 64)
    assert torch.equal(packed, qtensor._quantized_data)
    assert ours_scales.dtype == torch.float8_e4m3fn and ours_scales.shape == (64, 8)
    assert torch.equal(ours_scales.view(torch.uint8), block_scales.view(torch.uint8))
    assert torch.equal(gs, global_scale.float())
    theirs = qtensor.dequantize(dtype=torch.float32, scale=block_scales, double_scale=global_scale,
                                block_sizes={-1: nq.NVFP4_BLOCK})
    assert torch.equal(nq.nvfp4_dequantize(packed, ours_scales, gs), theirs)


def test_e2m1_rounds_ties_to_even_like_modelopt():
    y = torch.tensor(TIES)
    assert torch.equal(nq.e2m1_codes(y), mo_qtensor.NVFP4QTensor._cast_fp4(y.clone()))
    assert nq.e2m1_codes(y)[:7].tolist() == [0, 2, 2, 4, 4, 6, 6]  # 0 | 1 | 1 | 2 | 2 | 4 | 4


def test_even_element_sits_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    assert nq.pack_e2m1(codes).tolist() == [[0x21, 0xF3]]
    assert torch.equal(nq.unpack_e2m1(nq.pack_e2m1(codes)), codes)


def test_fp8_activation_fake_quant_matches_modelopt():
    x = _weights() * 3
    amax = torch.tensor(0.9)  # below the true amax: saturation is exercised too
    assert torch.equal(nq.fp8_fake_quant(x, amax), mo_tensor_quant.fp8_eager(x, amax))


def test_handlers_round_trip_and_report_their_layout():
    w = _weights()
    for mode in ("fp8", "nvfp4"):
        handler = get_handler(mode)
        tensors = handler.quantize(w, nq.tensor_amax(w), torch.tensor(2.0), torch.bfloat16)
        spec = handler.spec(64, 128, torch.bfloat16)
        assert {k: (tuple(t.shape), t.dtype) for k, t in tensors.items()} == spec
        assert (handler.dequantize(tensors) - w).norm() / w.norm() < 0.15


def test_unknown_mode_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"\['fp8', 'none', 'nvfp4'\]"):
        get_handler("int4")
    assert sorted(HANDLERS) == ["fp8", "none", "nvfp4"]


def test_nvfp4_refuses_inputs_that_are_not_whole_blocks():
    assert "multiple of the NVFP4 block" in get_handler("nvfp4").check(64, 40)
    assert get_handler("fp8").check(64, 40) is None


def test_kv_cache_scale_is_max_of_k_and_v_clamped_to_one():
    assert kv_cache_scale(torch.tensor(10.0), torch.tensor(20.0)).tolist() == [1.0]
    assert kv_cache_scale(torch.tensor(896.0), torch.tensor(448.0)).tolist() == [2.0]
    assert kv_cache_scale(torch.tensor(1.0), torch.tensor(1.0)).shape == (1,)
