"""The GPU steps of a trtllm build, in order (called by `build.build_trtllm_bundle`).

Each step writes into the bundle's temporary folder and logs what it runs. Imports of torch
modules, TensorRT and TensorRT-LLM happen here, never in `build.py`'s planning code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch import nn

from dflash_trt.backends.trtllm.plugin import LIBRARY_NAME, find_library
from dflash_trt.backends.trtllm.target_build import run_trtllm_build, write_model_class
from dflash_trt.checkpoint.hf import read_draft, read_target
from dflash_trt.engine.config import BuildConfig
from dflash_trt.errors import ConfigError
from dflash_trt.model.loader import DTYPES, load_draft

MIN_CAPABILITY = {"none": (8, 0), "fp8": (8, 9), "nvfp4": (10, 0)}  # FP8 tensor cores: Ada / Hopper; NVFP4: Blackwell


def check_gpu(cfg: BuildConfig) -> None:
    if not torch.cuda.is_available():
        raise ConfigError(f"{cfg.source}: backend 'trtllm' builds engines on a CUDA GPU; none is visible here")
    have, need = torch.cuda.get_device_capability(), MIN_CAPABILITY[cfg.quant]
    if have < need:
        raise ConfigError(f"{cfg.source}: field 'quant': {cfg.quant} needs compute capability "
                          f"{need[0]}.{need[1]}+, this GPU is {have[0]}.{have[1]}; use quant: none or another GPU")
    check_plugin_covers(find_library(), tuple(have))


def check_plugin_covers(library: Path, capability: tuple[int, int]) -> None:
    """Refuse a plugin library with no kernel this GPU can run (TensorRT would fail at the first step
    with "no kernel image is available"): the cubins / PTX its fatbin headers list (kernels/archs.py)."""
    from dflash_trt.kernels import archs

    built = archs.library_archs(library)
    if not archs.covers(built, capability):
        raise ConfigError(archs.uncovered_message(str(library), built, capability))


def copy_plugin(tmp_dir: Path, log=print) -> Path:
    library = find_library()
    (tmp_dir / "plugin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, tmp_dir / "plugin" / LIBRARY_NAME)
    log(f"plugin: {library}")
    return library


def convert_checkpoint(cfg: BuildConfig, plan, log=print) -> None:
    from dflash_trt.convert import ConvertConfig, convert

    if cfg.quant != "none" or cfg.kv_cache == "fp8":
        log("warning: calibrating on random token prompts (build configs carry no calibration data); "
            "for real scales run `dflash-trt convert --calib-data` and build from its checkpoint")
    shutil.rmtree(plan.checkpoint_dir, ignore_errors=True)
    convert(ConvertConfig(target=str(cfg.target_path()), draft=str(cfg.draft_path()), out=str(plan.checkpoint_dir),
                          dtype=plan.dtype, quant=cfg.quant, kv_cache="fp8" if cfg.kv_cache == "fp8" else "none",
                          tp=cfg.tp))
    log(f"converted checkpoint: {plan.checkpoint_dir}")


def build_target(cfg: BuildConfig, plan, tmp_dir: Path, log=print) -> None:
    from dflash_trt.checkpoint.configs import GENERATION_CONFIG
    from dflash_trt.tokenizer import TOKENIZER_FILES

    write_model_class(tmp_dir / "target", plan.settings)
    run_trtllm_build(plan.build_args, log)
    for name in (*TOKENIZER_FILES, GENERATION_CONFIG):
        if (cfg.target_path() / name).is_file():
            shutil.copy2(cfg.target_path() / name, tmp_dir / "target" / name)
    shutil.copy2(cfg.target_path() / "config.json", tmp_dir / "target" / "hf_config.json")


class TargetHead(nn.Module):
    """The two target tensors the draft graphs carry: embed_tokens and lm_head (no decoder stack)."""

    def __init__(self, config, embed: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.lm_head = nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False).requires_grad_(False)
        self.lm_head.weight.data = lm_head


def load_target_head(folder: Path, dtype: torch.dtype) -> TargetHead:
    ckpt = read_target(folder)
    head = "model.embed_tokens.weight" if ckpt.config.tie_word_embeddings else "lm_head.weight"
    tensors = ckpt.weights.load(sorted({"model.embed_tokens.weight", head}), dtype)
    return TargetHead(ckpt.config, tensors["model.embed_tokens.weight"], tensors[head])


def build_draft(cfg: BuildConfig, plan, tmp_dir: Path, log=print) -> None:
    from dflash_trt.backends.trtllm.draft_runner import ENGINE_FILES
    from dflash_trt.backends.trtllm.onnx_export import export_draft_graphs
    from dflash_trt.backends.trtllm.sessions import build_engine

    dtype = DTYPES[plan.dtype]
    from dflash_trt.model import draft_vocab

    draft = load_draft(read_draft(cfg.draft_path()), dtype, "cpu")
    head = load_target_head(cfg.target_path(), dtype)
    draft.use_vocab(draft_vocab.token_ids(cfg.draft_path(), cfg.runtime.draft_vocab_size, head.config.vocab_size,
                                          f"{cfg.source}: field 'runtime.draft_vocab_size'"), head.lm_head)
    paths = export_draft_graphs(draft, head, plan.draft_spec, tmp_dir / "draft")
    for name, onnx_path in paths.items():
        log(f"TensorRT: {onnx_path.name} -> {ENGINE_FILES[name]}")
        build_engine(onnx_path, tmp_dir / "draft" / ENGINE_FILES[name], plan.draft_spec.profile(name))
