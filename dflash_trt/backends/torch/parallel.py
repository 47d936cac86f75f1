"""Torch models from TensorRT-LLM checkpoints: TP = 1 in process, TP = N over torch.distributed.

Rank r builds `Target` / `DFlashDraft` with LOCAL dims (heads / tp, KV heads / tp (at least 1, the
converter duplicated them), intermediate / tp) from `rank{r}.safetensors` and swaps modules so the
math equals the unsharded model:
    q/k/v, gate/up        column-parallel: plain nn.Linear over local output features, no traffic
    o_proj, down_proj     row-parallel: local matmul, all_reduce(sum), then the replicated bias
    lm_head               column-parallel over the padded vocab: local logits, all_gather, cut to vocab
    embeddings, norms, fc, hidden_norm    replicated
Every rank then holds the same residual stream, taps and logits, runs the unchanged engine (one
process per rank: runtime/tp.py) and makes the same decisions. Backend: gloo on CPU, nccl on CUDA.

Quantized checkpoints are dequantized to fp32 (then cast to the compute dtype). `simulate=True`
also fake-quantizes every linear input with the checkpoint's activation scale (W8A8 FP8 / W4A4
NVFP4, as the GPU GEMMs do) and stores K/V in the caches rounded through FP8 with
`kv_cache_scaling_factor` (FP8 KV). Modules are never fused here: the pre-forward hooks of
q/k/v/gate/up must see their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from dflash_trt.checkpoint.hf import check_pair
from dflash_trt.checkpoint.quant.modes import handler_for_algo
from dflash_trt.checkpoint.quant.numerics import fp8_round_trip
from dflash_trt.checkpoint.trtllm import RankState, TrtllmCheckpoint, load_rank, read_trtllm
from dflash_trt.checkpoint.trtllm_config import local_dims, padded_vocab
from dflash_trt.errors import CheckpointError
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.layers import MLP, AttentionProjections, Rotary
from dflash_trt.model.loader import LoadedPair, resolve_device, resolve_dtype
from dflash_trt.model.target import Target
from dflash_trt.tokenizer import has_tokenizer, load_tokenizer


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local @ W_local^T) + b; W is [out, in / tp], b [out] is replicated."""

    def __init__(self, in_local: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if _world() > 1:
            dist.all_reduce(y)
        return y if self.bias is None else y + self.bias


class ParallelLMHead(nn.Module):
    """Logits [..., vocab] from a [padded_vocab / tp, H] shard: local matmul, all_gather, cut padding."""

    def __init__(self, hidden: int, vocab: int, tp: int):
        super().__init__()
        self.vocab = vocab
        self.weight = nn.Parameter(torch.empty(padded_vocab(vocab, tp) // tp, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)
        if _world() > 1:
            parts = [torch.empty_like(local) for _ in range(_world())]
            dist.all_gather(parts, local.contiguous())
            local = torch.cat(parts, dim=-1)
        return local[..., : self.vocab]


class RankAttention(AttentionProjections):
    """Local heads (q/k/v are column-parallel as they stand); o_proj row-parallel."""

    def __init__(self, dims):
        super().__init__(dims)
        self.o_proj = RowParallelLinear(dims.num_heads * dims.head_dim, dims.hidden_size, dims.attention_bias)


class RankMLP(MLP):
    def __init__(self, dims):
        super().__init__(dims)
        self.down_proj = RowParallelLinear(dims.intermediate_size, dims.hidden_size, dims.mlp_bias)


def _swap_layers(layers: nn.ModuleList, dims) -> None:
    for layer in layers:
        layer.self_attn, layer.mlp = RankAttention(dims), RankMLP(dims)


def _load(module: nn.Module, state: dict, dtype: torch.dtype, device) -> nn.Module:
    module.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    dims = module.config.dims
    module.rotary = Rotary(dims.rope, dims.head_dim)  # non-persistent buffer: rebuilt off the meta device
    return module.to(device).eval().requires_grad_(False)


def fp8_kv_writes(cache, scales: dict[int, torch.Tensor]):
    """Make `cache` store K/V rounded through e4m3 with each layer's scale: an FP8 KV cache.

    Rounding at the write (not in attention) keeps exactly the FP8 semantics: what is cached is FP8,
    the drafter's transient noise-block K/V are not."""
    write = cache.write

    def fp8_write(layer, slots, positions, k, v, valid=None, end=None):
        scale = scales[layer]
        return write(layer, slots, positions, fp8_round_trip(k, scale), fp8_round_trip(v, scale), valid, end)

    cache.write = fp8_write  # instance attribute shadows the method
    return cache


class RankTarget(Target):
    kv_scales: dict[int, torch.Tensor] | None = None  # set by `_simulate` for FP8 KV checkpoints

    def new_cache(self, n_slots: int, capacity: int):
        cache = super().new_cache(n_slots, capacity)
        return cache if self.kv_scales is None else fp8_kv_writes(cache, self.kv_scales)


class RankDraft(DFlashDraft):
    kv_scales: dict[int, torch.Tensor] | None = None

    def new_cache(self, n_slots: int, capacity: int):
        cache = super().new_cache(n_slots, capacity)
        return cache if self.kv_scales is None else fp8_kv_writes(cache, self.kv_scales)


def _simulate(module: nn.Module, rank: RankState, handler, device) -> None:
    """Fake-quantize linear inputs (pre-forward hooks) and store K/V as FP8 (cache writes)."""
    for name, scales in rank.activation_scales.items():
        scales = {k: v.to(device) for k, v in scales.items()}
        hook = (lambda s: lambda mod, args: (handler.fake_quant_input(args[0], s),))(scales)
        module.get_submodule(name).register_forward_pre_hook(hook)
    if rank.kv_scales:
        module.kv_scales = {layer: scale.to(device) for layer, scale in rank.kv_scales.items()}


def build_target(ckpt: TrtllmCheckpoint, rank: int, dtype: torch.dtype, device, simulate: bool) -> Target:
    """This rank's Target (local dims, parallel modules) from `rank{rank}.safetensors`."""
    cfg = ckpt.config
    config = replace(cfg.model, dims=local_dims(cfg.model.dims, cfg.tp_size), tie_word_embeddings=False)
    with torch.device("meta"):
        target = RankTarget(config)
        _swap_layers(target.model.layers, config.dims)
        target.lm_head = ParallelLMHead(config.dims.hidden_size, config.vocab_size, cfg.tp_size)
    state = load_rank(ckpt, rank)
    target = _load(target, state.state, dtype, device)
    if simulate:
        _simulate(target, state, handler_for_algo(cfg.quant.quant_algo), device)
    return target


def build_draft(ckpt: TrtllmCheckpoint, rank: int, dtype: torch.dtype, device, simulate: bool) -> DFlashDraft:
    """This rank's DFlashDraft (local dims; fc / hidden_norm replicated)."""
    cfg = ckpt.config
    config = replace(cfg.model, dims=local_dims(cfg.model.dims, cfg.tp_size))
    with torch.device("meta"):
        draft = RankDraft(config)
        _swap_layers(draft.layers, config.dims)
    state = load_rank(ckpt, rank)
    draft = _load(draft, state.state, dtype, device)
    if simulate:
        _simulate(draft, state, handler_for_algo(cfg.quant.quant_algo), device)
    return draft


@dataclass
class _Checked:  # what `check_pair` reads from a checkpoint
    folder: Path
    config: object


def load_trtllm_pair(target_dir, draft_dir, rank: int = 0, dtype: str = "auto", device: str = "auto",
                     simulate: bool = True) -> LoadedPair:
    """Read, check and build rank `rank` of a converted pair (tokenizer from the target folder)."""
    target_ckpt, draft_ckpt = read_trtllm(target_dir), read_trtllm(draft_dir)
    if target_ckpt.config.is_draft or not draft_ckpt.config.is_draft:
        raise CheckpointError(f"{target_dir}, {draft_dir}: expected a target then a DFlash drafter checkpoint")
    if target_ckpt.config.tp_size != draft_ckpt.config.tp_size:
        raise CheckpointError(f"{draft_ckpt.folder / 'config.json'}: field 'mapping.tp_size': "
                              f"{draft_ckpt.config.tp_size} != the target's {target_ckpt.config.tp_size}")
    check_pair(_Checked(target_ckpt.folder, target_ckpt.config.model),
               _Checked(draft_ckpt.folder, draft_ckpt.config.model))
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    target = build_target(target_ckpt, rank, torch_dtype, dev, simulate)
    draft = build_draft(draft_ckpt, rank, torch_dtype, dev, simulate)
    tokenizer = load_tokenizer(target_dir) if has_tokenizer(target_dir) else None
    return LoadedPair(target, draft, tokenizer, Path(target_dir), Path(draft_dir))
