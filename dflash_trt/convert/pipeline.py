"""`convert`: a Hugging Face target + z-lab DFlash drafter -> a TensorRT-LLM checkpoint pair.

Output folder (written into a temp folder beside `out`, renamed into place only when complete):
    out/target/   config.json, rank{r}.safetensors, tokenizer files of the HF target
    out/draft/    config.json, rank{r}.safetensors (drafter naming: docs/conversion.md)
    out/convert_config.json   this ConvertConfig (round-trips through `ConvertConfig.load`)
    out/calibration.json      the amaxes behind every scale (only when quantizing)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
from dflash_trt.checkpoint.json_fields import load_json
from dflash_trt.checkpoint.quant.modes import HANDLERS, KV_CACHE_MODES, get_handler
from dflash_trt.checkpoint.trtllm_config import DTYPE_NAMES, QuantSection, TrtllmConfig, check_engine_rope, check_tp
from dflash_trt.checkpoint.trtllm_layout import check_quantizable
from dflash_trt.checkpoint.trtllm_writer import ModelAmax, convert_tensors, write_checkpoint
from dflash_trt.errors import ConfigError, UnsupportedModelError, field_error
from dflash_trt.tokenizer import TOKENIZER_FILES

CONFIG_FILE = "convert_config.json"
CALIBRATION_FILE = "calibration.json"
EXCLUDED = {"target": ("lm_head",), "draft": ("dflash.fc",)}  # kept in `dtype` when quantizing


@dataclass(frozen=True)
class ConvertConfig:
    target: str  # HF target folder
    draft: str  # z-lab DFlash drafter folder
    out: str  # output folder (must not exist, or be empty)
    dtype: str = "bf16"  # storage of tensors that are not quantized: bf16 | fp16 | fp32
    quant: str = "none"  # none | fp8 | nvfp4
    kv_cache: str = "none"  # none | fp8
    tp: int = 1
    calib_data: str | None = None  # .jsonl / .txt prompts; None = random token prompts
    calib_samples: int = 32  # prompts used (random prompts: how many to draw)
    calib_seq_len: int = 64  # length of random prompts
    calib_new_tokens: int = 32  # tokens decoded per prompt during calibration
    calibrator: str = "auto"  # auto | builtin | modelopt
    seed: int = 0

    def __post_init__(self):
        choices = {"dtype": DTYPE_NAMES, "quant": HANDLERS, "kv_cache": KV_CACHE_MODES,
                   "calibrator": ("auto", "builtin", "modelopt")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise field_error(CONFIG_FILE, name, f"{getattr(self, name)!r} is not one of {sorted(allowed)}")
        for name in ("tp", "calib_samples", "calib_seq_len", "calib_new_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise field_error(CONFIG_FILE, name, f"expected an integer >= 1, got {getattr(self, name)!r}")

    @property
    def needs_calibration(self) -> bool:
        return self.quant != "none" or self.kv_cache != "none"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> "ConvertConfig":
        data = load_json(path)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise field_error(path, unknown[0], "unknown field")
        try:
            return cls(**data)
        except TypeError as exc:  # a required field is missing
            raise ConfigError(f"{path}: {exc}") from None
        except ConfigError as exc:  # __post_init__ names the default file name; name the real one
            raise ConfigError(exc.message.replace(f"{CONFIG_FILE}:", f"{path}:", 1)) from None


@dataclass
class ConvertResult:
    out: Path
    seconds: float
    calibrator: str | None  # None when nothing was calibrated
    rank_files: int


def _model_config(model, config: ConvertConfig, kind: str) -> TrtllmConfig:
    handler = get_handler(config.quant)
    quant = QuantSection(handler.quant_algo, KV_CACHE_MODES[config.kv_cache], handler.group_size, EXCLUDED[kind])
    return TrtllmConfig(model=model, dtype=config.dtype, tp_size=config.tp, quant=quant)


def _check_layout(cfg: TrtllmConfig, folder: Path) -> None:
    where = folder / "config.json"
    if not cfg.is_draft and cfg.model.family == "qwen3" and cfg.model.dims.attention_bias:
        raise UnsupportedModelError(f"{where}: field 'attention_bias': TensorRT-LLM's Qwen3 attention has no "
                                    "bias on attention.dense; expected false")
    check_tp(cfg.model.dims, cfg.tp_size, where)
    if not cfg.is_draft:  # the drafter's cos / sin come from our own table in its graphs
        check_engine_rope(cfg.model.dims.rope, where)
    problem = check_quantizable(cfg)
    if problem:
        raise UnsupportedModelError(f"{where}: field '{problem[0]}': {problem[1]}")


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: output folder already exists and is not empty; remove it or pick another --out")


def _calibrate(config: ConvertConfig, target_ckpt, draft_ckpt) -> tuple[dict, tuple[ModelAmax, ModelAmax]]:
    from dflash_trt.convert.calibrate import (
        calibrate_pair,
        load_prompts,
        random_prompts,
        resolve_calibrator,
        unfused_models,
    )
    from dflash_trt.tokenizer import has_tokenizer, load_tokenizer

    vocab = target_ckpt.config.vocab_size
    if config.calib_data is None:
        prompts = random_prompts(config.calib_samples, config.calib_seq_len, vocab, config.seed)
    else:
        tokenizer = load_tokenizer(target_ckpt.folder) if has_tokenizer(target_ckpt.folder) else None
        prompts = load_prompts(Path(config.calib_data), vocab, tokenizer, config.calib_samples)
    calibrator = resolve_calibrator(config.calibrator)
    target, draft = unfused_models(target_ckpt, draft_ckpt)
    amax = calibrate_pair(target, draft, prompts, config.calib_new_tokens, config.quant, calibrator)
    info = {"calibrator": calibrator, "prompts": len(prompts), "random_prompts": config.calib_data is None}
    return info, amax


def _write(tmp: Path, config: ConvertConfig, parts, info: dict | None, amax) -> int:
    count = 0
    for kind, (ckpt, cfg, model_amax) in parts.items():
        folder = tmp / kind
        folder.mkdir()
        ranks = convert_tensors(cfg, ckpt.weights, model_amax)
        write_checkpoint(folder, cfg, ranks)
        count += len(ranks)
    for name in TOKENIZER_FILES:
        if (Path(config.target) / name).is_file():
            shutil.copy2(Path(config.target) / name, tmp / "target" / name)
    (tmp / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    if info is not None:
        info |= {"target": amax[0].to_dict(), "draft": amax[1].to_dict()}
        (tmp / CALIBRATION_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return count


def _plain_permissions(folder: Path) -> None:
    """mkdtemp makes a 0700 folder and safetensors writes 0600 files: give the artifact the umask's modes."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def convert(config: ConvertConfig) -> ConvertResult:
    """Read and check the HF pair, calibrate if quantizing, write the TRT-LLM pair atomically."""
    t0 = time.perf_counter()
    out = Path(config.out)
    _check_out(out)
    target_ckpt, draft_ckpt = read_target(config.target), read_draft(config.draft)
    check_pair(target_ckpt, draft_ckpt)
    if draft_ckpt.config.is_dflash2:
        raise UnsupportedModelError(f"{draft_ckpt.folder / 'config.json'}: field 'architectures': DFlash2DraftModel: "
                                    "the TensorRT-LLM checkpoint layout has no DFlash2 tensors (convolutions, candidate "
                                    "selector); serve it with backend: torch, which runs DFlash2")
    cfgs = {"target": _model_config(target_ckpt.config, config, "target"),
            "draft": _model_config(draft_ckpt.config, config, "draft")}
    for kind, ckpt in (("target", target_ckpt), ("draft", draft_ckpt)):
        _check_layout(cfgs[kind], ckpt.folder)
    info, amax = _calibrate(config, target_ckpt, draft_ckpt) if config.needs_calibration else (None, (None, None))
    parts = {"target": (target_ckpt, cfgs["target"], amax[0]), "draft": (draft_ckpt, cfgs["draft"], amax[1])}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        count = _write(tmp, config, parts, info, amax)
        _plain_permissions(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ConvertResult(out, time.perf_counter() - t0, info and info["calibrator"], count)
