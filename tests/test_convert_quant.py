"""FP8 / NVFP4 / FP8-KV checkpoints: bytes equal Model Optimizer's export, weights within each
format's error bound, calibration equal to Model Optimizer's, and the simulated runner works."""

import copy
import json

import pytest
import torch
from convert_helpers import fp8_bound, nvfp4_bound, run_convert
from safetensors.torch import load_file

from dflash_trt.backends.torch.parallel import load_trtllm_pair
from dflash_trt.checkpoint.hf import read_draft, read_target
from dflash_trt.checkpoint.quant import numerics as nq
from dflash_trt.checkpoint.trtllm_names import TARGET_NAMES, hf_names_of, linear_of
from dflash_trt.convert.calibrate import calibrate_pair, random_prompts, unfused_models

mtq = pytest.importorskip("modelopt.torch.quantization")
pytestmark = pytest.mark.usefixtures("one_thread")
QUANT_SUFFIXES = ("weight", "weights_scaling_factor", "weights_scaling_factor_2")


@pytest.fixture(scope="module")
def ours(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    runs = {"fp8": dict(quant="fp8", kv_cache="fp8"), "nvfp4": dict(quant="nvfp4", kv_cache="fp8"),
            "nvfp4_tp2": dict(quant="nvfp4", tp=2)}
    for name, kw in runs.items():
        run_convert(tiny_pair[0], tiny_pair[1], root / name, **kw)
    return root


def modelopt_export(target_dir, out, recipe, tp):
    """Model Optimizer 0.47: quantize the HF target (max calibration) and export a TRT-LLM checkpoint."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    batches = [torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    mtq.quantize(model, copy.deepcopy(recipe), lambda m: [m(b) for b in batches])
    export_tensorrt_llm_checkpoint(model, "qwen", dtype=torch.float32, export_dir=out, inference_tensor_parallel=tp)
    return [load_file(str(out / f"rank{r}.safetensors")) for r in range(tp)]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@pytest.mark.filterwarnings("ignore::UserWarning")  # modelopt's export chatter (no tensorrt_llm here, ...)
@pytest.mark.parametrize("mode, run, tp", [("fp8", "fp8", 1), ("nvfp4", "nvfp4_tp2", 2)])
def test_quantized_weights_are_bit_identical_to_modelopt_export(mode, run, tp, ours, tiny_pair, tmp_path):
    recipe = mtq.FP8_DEFAULT_CFG if mode == "fp8" else mtq.NVFP4_DEFAULT_CFG
    theirs = modelopt_export(tiny_pair[0], tmp_path / "modelopt", recipe, tp)
    for r in range(tp):
        mine = load_file(str(ours / run / "target" / f"rank{r}.safetensors"))
        compared = 0
        for name, t in theirs[r].items():
            linear = linear_of(name)
            if linear and linear[0] != "lm_head" and linear[1] in QUANT_SUFFIXES + ("activation_scaling_factor",):
                assert (mine[name].dtype, mine[name].shape) == (t.dtype, t.shape), name
                if linear[1] in QUANT_SUFFIXES:  # activation scales depend on the calibration data
                    assert torch.equal(_bytes(mine[name]), _bytes(t)), name
                compared += 1
        assert compared == 4 * 5 * (3 if mode == "fp8" else 4)  # layers x linears x tensors


def _fused_reference(hf_state, trt_name):
    return torch.cat([hf_state[n] for n in hf_names_of(TARGET_NAMES, trt_name)])


@pytest.mark.parametrize("mode", ["fp8", "nvfp4"])
def test_dequantized_weights_are_within_the_format_bound(mode, ours, tiny_pair):
    hf = tiny_pair[2].state_dict()
    rank = load_file(str(ours / mode / "target" / "rank0.safetensors"))
    for name in [n for n in rank if n.endswith(".weight") and linear_of(n) and linear_of(n)[0] != "lm_head"]:
        base, w = name[: -len(".weight")], _fused_reference(hf, name)
        if mode == "fp8":
            scale = rank[f"{base}.weights_scaling_factor"]
            err, bound = (nq.fp8_dequantize(rank[name], scale) - w).abs(), fp8_bound(w, scale)
        else:
            scales, gs = rank[f"{base}.weights_scaling_factor"], rank[f"{base}.weights_scaling_factor_2"]
            err, bound = (nq.nvfp4_dequantize(rank[name], scales, gs) - w).abs(), nvfp4_bound(w, scales, gs)
        assert (err <= bound).all(), name


def test_activation_and_kv_scales_come_from_calibration(ours):
    calibration = json.loads((ours / "fp8" / "calibration.json").read_text())
    inputs, kv = calibration["target"]["inputs"], calibration["target"]["kv"]
    rank = load_file(str(ours / "fp8" / "target" / "rank0.safetensors"))
    qkv_amax = max(inputs[f"model.layers.2.self_attn.{p}_proj"] for p in "qkv")
    assert rank["transformer.layers.2.attention.qkv.activation_scaling_factor"].item() == pytest.approx(
        qkv_amax / 448, rel=1e-6)
    assert len(kv) == 4 and all(k > 0 and v > 0 for k, v in kv.values())
    draft = load_file(str(ours / "fp8" / "draft" / "rank0.safetensors"))
    for tensors, layers in ((rank, 4), (draft, 2)):
        scales = [tensors[f"transformer.layers.{i}.attention.kv_cache_scaling_factor"] for i in range(layers)]
        assert all(s.dtype == torch.float32 and s.shape == (1,) and s.item() >= 1.0 for s in scales)
    config = json.loads((ours / "nvfp4" / "target" / "config.json").read_text())["quantization"]
    assert (config["quant_algo"], config["kv_cache_quant_algo"], config["group_size"]) == ("NVFP4", "FP8", 16)
    assert config["exclude_modules"] == ["lm_head"]


def test_builtin_calibration_equals_modelopt(tiny_pair):
    prompts = random_prompts(3, 12, 256, seed=1)
    target, draft = unfused_models(read_target(tiny_pair[0]), read_draft(tiny_pair[1]))
    builtin = calibrate_pair(target, draft, prompts, 6, "fp8", "builtin")
    modelopt = calibrate_pair(target, draft, prompts, 6, "fp8", "modelopt")
    for a, b in zip(builtin, modelopt):
        assert len(a.inputs) in (4 * 7, 2 * 7) and a.inputs == b.inputs
        assert a.weights == b.weights and a.kv == b.kv


def test_simulation_quantizes_inputs_and_stores_fp8_kv(ours):
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(3))
    runs = {}
    for simulate in (True, False):
        pair = load_trtllm_pair(ours / "fp8" / "target", ours / "fp8" / "draft", dtype="fp32", device="cpu",
                                simulate=simulate)
        cache = pair.target.new_cache(1, 24)
        runs[simulate] = pair.target(ids, torch.arange(20)[None], cache, torch.tensor([0]))[0], cache
    assert not torch.equal(runs[True][0], runs[False][0])  # the activation hooks fired
    scale = load_file(str(ours / "fp8" / "target" / "rank0.safetensors"))[
        "transformer.layers.0.attention.kv_cache_scaling_factor"]
    for cache, on_grid in ((runs[True][1], True), (runs[False][1], False)):
        k = cache.k[0]
        assert torch.equal(nq.fp8_round_trip(k, scale), k) == on_grid  # cached K is e4m3 (x scale) or not


@pytest.mark.parametrize("mode, min_cosine", [("fp8", 0.99), ("nvfp4", 0.9)])
def test_simulated_runner_tracks_the_fp32_model(mode, min_cosine, ours, tiny_pair):
    ids = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(2))
    reference = tiny_pair[2](ids).logits.flatten()
    for simulate in (True, False):
        pair = load_trtllm_pair(ours / mode / "target", ours / mode / "draft", dtype="fp32", device="cpu",
                                simulate=simulate)
        logits, _ = pair.target(ids, torch.arange(30)[None].expand(2, -1), pair.target.new_cache(2, 32),
                                torch.arange(2))
        assert torch.cosine_similarity(logits.flatten(), reference, dim=0) > min_cosine
