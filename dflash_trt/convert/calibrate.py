"""Calibration for FP8 / NVFP4 / FP8-KV conversion: max |x| over DFlash decoding of calibration prompts.

Forward loop: the prompts are decoded greedily by the target + drafter pair, so the target sees
prefill and verify blocks and the drafter sees context features and noise blocks, i.e. the
activations both meet at inference. Recorded per model (Model Optimizer's "max" algorithm):
- inputs:  max |x| entering every decoder-layer linear (q/k/v/o/gate/up/down)
- weights: max |W| of those linears
- kv:      max |K| and max |V| per layer over every entry written to the KV cache (K after k_norm
           and RoPE: exactly what an FP8 cache stores; the drafter caches only context K/V)
Calibrators: "builtin" (forward hooks, pure torch) and "modelopt" (nvidia-modelopt's max
calibrator run on our torch modules; K/V amax still comes from our cache hooks, since modelopt
cannot see inside our attention). Modules are built unfused (`unfused_models`) so every linear's
input passes through its nn.Linear. "auto" takes modelopt when it is importable. Both give identical amaxes
(tests/test_convert_quant.py).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from dflash_trt.checkpoint.quant.numerics import tensor_amax
from dflash_trt.checkpoint.trtllm_writer import ModelAmax
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.errors import ConfigError, MissingDependencyError
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.layers import Rotary
from dflash_trt.model.target import Target

CALIBRATORS = ("auto", "builtin", "modelopt")
BATCH = 8
ID_KEYS = ("ids", "token_ids")  # JSONL keys holding token ids (token_ids: scripts/make_tiny_pair.py prompts)


def resolve_calibrator(name: str) -> str:
    if name == "auto":
        return "modelopt" if importlib.util.find_spec("modelopt") is not None else "builtin"
    return name


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (length,), generator=g).tolist()) for _ in range(n)]


def _jsonl_prompt(line: str, where: str, tokenizer) -> list[int]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    ids = next((item[k] for k in ID_KEYS if isinstance(item, dict) and isinstance(item.get(k), list)), None)
    if ids is not None:
        return ids
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return _encode(item["text"], where, tokenizer)
    raise ConfigError(f"{where}: expected an object with 'ids' / 'token_ids' (list of ints) or 'text' (string)")


def _encode(text: str, where: str, tokenizer) -> list[int]:
    if tokenizer is None:
        raise ConfigError(f"{where}: text prompts need the target's tokenizer.json; give 'ids' instead")
    return tokenizer.encode(text, add_special_tokens=True)


def load_prompts(path: Path, vocab: int, tokenizer=None, limit: int | None = None) -> list[tuple[int, ...]]:
    """Prompts from .jsonl ({"ids" | "token_ids": [...]} or {"text": ...} per line) or .txt (one a line)."""
    if not path.is_file():
        raise ConfigError(f"{path}: calibration data file not found")
    if path.suffix not in (".jsonl", ".txt"):
        raise ConfigError(f"{path}: calibration data must be .jsonl or .txt, got '{path.suffix}'")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        ids = _jsonl_prompt(line, where, tokenizer) if path.suffix == ".jsonl" else _encode(line, where, tokenizer)
        if not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
            raise ConfigError(f"{where}: expected a non-empty list of token ids in 0..{vocab - 1}")
        prompts.append(tuple(ids))
    if not prompts:
        raise ConfigError(f"{path}: no prompts found")
    return prompts[:limit]


def decode_all(target, draft, prompts, max_new_tokens: int) -> None:
    """The calibration forward loop: greedy DFlash decoding of every prompt, BATCH at a time."""
    requests = [Request(p, stop=StopCriteria(max_new_tokens)) for p in prompts]
    for i in range(0, len(requests), BATCH):
        speculative_generate(target, draft, requests[i : i + BATCH])


def layer_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Decoder-layer linears by HF module name: 'model.layers.0.self_attn.q_proj', 'layers.1.mlp.up_proj'."""
    return {n: m for n, m in model.named_modules() if ".layers." in f".{n}" and n.endswith("_proj")}


def _update(table: dict, key, value: torch.Tensor) -> None:
    table[key] = max(table.get(key, 0.0), float(value))


def unfused_models(target_ckpt, draft_ckpt) -> tuple[Target, DFlashDraft]:
    """fp32 modules whose q/k/v/gate/up run as separate nn.Linear calls, so hooks (ours and
    modelopt's) see every linear input; the inference loaders may fuse those matmuls."""
    models = []
    for ckpt, cls in ((target_ckpt, Target), (draft_ckpt, DFlashDraft)):
        names = [n for n in ckpt.weights.names() if not n.endswith("rotary_emb.inv_freq")]
        state = ckpt.weights.load(names, torch.float32)
        if cls is Target and ckpt.config.tie_word_embeddings:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        with torch.device("meta"):
            model = cls(ckpt.config)
        model.load_state_dict(state, strict=True, assign=True)
        model.rotary = Rotary(ckpt.config.dims.rope, ckpt.config.dims.head_dim)  # rebuilt off the meta device
        models.append(model.eval().requires_grad_(False))
    return models[0], models[1]


@contextmanager
def recording(model: nn.Module, amax: ModelAmax, inputs: bool):
    """Record K/V amax at every cache write (and linear input amax when `inputs`) while the block runs."""
    hooks = []
    if inputs:
        for name, linear in layer_linears(model).items():
            hook = (lambda key: lambda mod, args: _update(amax.inputs, key, tensor_amax(args[0])))(name)
            hooks.append(linear.register_forward_pre_hook(hook))
    model.new_cache = _recording_caches(model.new_cache, amax)  # instance attribute shadows the method
    try:
        yield amax
    finally:
        for hook in hooks:
            hook.remove()
        del model.new_cache


def _recording_caches(new_cache, amax: ModelAmax):
    """`new_cache` whose caches record max |K| and max |V| per layer of every (valid) entry written."""
    def build(*args, **kwargs):
        cache = new_cache(*args, **kwargs)
        write = cache.write

        def recording_write(layer, slots, positions, k, v, valid=None, end=None):
            kept_k, kept_v = (k, v) if valid is None else (k[valid], v[valid])
            old = amax.kv.get(layer, (0.0, 0.0))
            amax.kv[layer] = (max(old[0], float(tensor_amax(kept_k))), max(old[1], float(tensor_amax(kept_v))))
            return write(layer, slots, positions, k, v, valid, end)

        cache.write = recording_write
        return cache
    return build


def _modelopt_inputs(model: nn.Module, forward_loop, quant: str) -> dict[str, float | None]:
    """Linear input amaxes from Model Optimizer's max calibration of a copy of `model`."""
    if importlib.util.find_spec("modelopt") is None:
        raise MissingDependencyError("nvidia-modelopt is not installed; pip install 'dflash-trt[dev]' "
                                     "or pass --calibrator builtin")
    import modelopt.torch.quantization as mtq

    recipe = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG if quant == "nvfp4" else mtq.FP8_DEFAULT_CFG)
    quantized = copy.deepcopy(model)
    mtq.quantize(quantized, recipe, forward_loop)
    amaxes = {name: m.input_quantizer.amax for name, m in layer_linears(quantized).items()}
    return {name: None if a is None else float(a) for name, a in amaxes.items()}


def calibrate_pair(target: Target, draft: DFlashDraft, prompts, max_new_tokens: int, quant: str, calibrator: str
                   ) -> tuple[ModelAmax, ModelAmax]:
    """Amaxes of the target and the drafter (fp32 modules from `unfused_models`)."""
    amax = ModelAmax(), ModelAmax()
    builtin = calibrator == "builtin" or quant == "none"
    with torch.inference_mode(), recording(target, amax[0], builtin), recording(draft, amax[1], builtin):
        decode_all(target, draft, prompts, max_new_tokens)
    if not builtin:
        amax[0].inputs = _modelopt_inputs(target, lambda t: decode_all(t, draft, prompts, max_new_tokens), quant)
        amax[1].inputs = _modelopt_inputs(draft, lambda d: decode_all(target, d, prompts, max_new_tokens), quant)
    for model, a in zip((target, draft), amax):
        linears = layer_linears(model)
        a.weights = {name: float(tensor_amax(m.weight)) for name, m in linears.items()}
        unseen = sorted(set(linears) - {n for n, v in a.inputs.items() if v is not None})
        if unseen:
            raise RuntimeError(f"calibration saw no input for {unseen[:3]}: are q/k/v or gate/up fused?")
    return amax
