"""Typed build configuration (`dflash-trt build CONFIG.yaml`), validated field by field.

Every error names the YAML file and the dotted field path. Paths in the file are relative to
the file itself; `builtin:tiny-qwen3` and `builtin:tiny-qwen3-dflash` name the shipped pair.
The resolved config is written into every bundle (`build_config.yaml`) and hashed into the
manifest, so an unchanged config with unchanged inputs reuses the previous bundle.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from dflash_trt.errors import ConfigError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BACKENDS = ("torch", "trtllm")
DTYPES = ("fp32", "bf16", "fp16", "auto")
QUANTS = ("none", "fp8", "nvfp4")
WIDTH_POLICIES = ("schedule", "measured", "auto")  # runtime/width.py


def resolve_model_path(value: str, base: Path) -> Path:
    """`builtin:NAME` -> the shipped asset folder; a relative path -> relative to `base`."""
    if value.startswith("builtin:"):
        return ASSETS / value.removeprefix("builtin:")
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


@dataclass
class RuntimeConfig:
    device: str = "auto"
    max_batch_size: int = 8
    max_seq_len: int = 1024
    # {batch size: block size}: steps with at least that many requests verify narrower blocks
    # (busy steps are compute-bound; lossless at any width); block 1 = plain autoregressive steps,
    # no draft pass. Empty: always the bundle's block size.
    block_size_schedule: dict = field(default_factory=dict)
    # Confidence cut (decoding/drafts.py `confident_drafts`): verify only the drafts whose running product
    # of draft probabilities is >= this. Saves verify rows where they cost (CPUs); 0: full blocks.
    draft_confidence: float = 0.0
    # Draft vocabulary (model/draft_vocab.py): the drafter scores only the N most frequent tokens of
    # its `dflash_trt_draft_vocab.json` when proposing (lossless). null: the full vocabulary.
    draft_vocab_size: int | None = None
    # Sampled requests (temperature > 0). false: greedy requests only, refused otherwise; on backend trtllm
    # the target engine then emits no block logits, whose buffers TensorRT-LLM reserves at start
    # (max_num_tokens x (K+1) x V floats: ~40 GB for Qwen3-8B at block 16; docs/trtllm-backend.md).
    sampled_requests: bool = True
    # Verify widths (runtime/width.py): "schedule" (the block size, or block_size_schedule's) or "measured":
    # each step's width from this machine's measured acceptance per temperature band and step seconds, down
    # to plain AR steps where drafting measures slower (a lone greedy request keeps the schedule's width).
    # "auto" (default): measured on CPU, where verify rows cost; the schedule on GPUs, where they are ~free.
    width_policy: str = "auto"
    # Prefix cache (runtime/prefix_cache.py): bytes of K/V (the target's and the drafter's context) kept for
    # blocks of finished requests' committed tokens, so a request whose prompt starts with them prefills only
    # the rest. 0: off.
    prefix_cache_bytes: int = 256 << 20
    # On CUDA (torch backend): the draft and verify passes replayed as CUDA graphs, one per batch of slots, block
    # width and 256-position bucket of context (backends/torch/graphs.py); false: every pass eager.
    cuda_graphs: bool = True


@dataclass
class GoldenConfig:
    prompts: list = field(default_factory=lambda: ["builtin:heldout[:4]"])
    max_new_tokens: int = 32
    tau_tolerance: float = 0.05  # allowed relative drop of mean acceptance length
    size_tolerance: float = 0.02  # allowed relative growth of the bundle


@dataclass
class BuildConfig:
    name: str
    target: str
    draft: str
    backend: str = "torch"
    dtype: str = "auto"
    quant: str = "none"
    kv_cache: str = "auto"
    tp: int = 1
    block_size: int | None = None
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    golden: GoldenConfig = field(default_factory=GoldenConfig)
    output: str | None = None  # bundle folder; default out/bundles/<name> next to the config
    repository: str | None = None  # Triton repository for publish; default out/triton_repo
    source: str = ""  # the YAML file this came from (not part of the hash)

    # --- derived -------------------------------------------------------------------------------
    @property
    def base(self) -> Path:
        return Path(self.source).parent if self.source else Path.cwd()

    def target_path(self) -> Path:
        return resolve_model_path(self.target, self.base)

    def draft_path(self) -> Path:
        return resolve_model_path(self.draft, self.base)

    def output_path(self) -> Path:
        return resolve_model_path(self.output, self.base) if self.output else self.base / "out" / "bundles" / self.name

    def repository_path(self) -> Path:
        return resolve_model_path(self.repository, self.base) if self.repository else self.base / "out" / "triton_repo"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("source")
        return d

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def _check(cfg: BuildConfig, where: str) -> None:
    def bad(path: str, problem: str):
        raise ConfigError(f"{where}: field '{path}': {problem}")

    if not cfg.name or not cfg.name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        bad("name", f"expected letters, digits, '-', '_' or '.', got {cfg.name!r}")
    for key, allowed in (("backend", BACKENDS), ("dtype", DTYPES), ("quant", QUANTS), ("kv_cache", ("auto", "fp8"))):
        if getattr(cfg, key) not in allowed:
            bad(key, f"expected one of {', '.join(allowed)}, got {getattr(cfg, key)!r}")
    if cfg.tp < 1:
        bad("tp", f"must be >= 1, got {cfg.tp}")
    if cfg.block_size is not None and cfg.block_size < 2:
        bad("block_size", f"must be >= 2, got {cfg.block_size}")
    if cfg.runtime.max_batch_size < 1:
        bad("runtime.max_batch_size", f"must be >= 1, got {cfg.runtime.max_batch_size}")
    for batch, block in cfg.runtime.block_size_schedule.items():
        if not (isinstance(batch, int) and isinstance(block, int) and batch >= 1 and block >= 1):
            bad("runtime.block_size_schedule", f"expected {{batch size >= 1: block size >= 1}}, got {batch!r}: {block!r}")
    conf = cfg.runtime.draft_confidence
    if not (isinstance(conf, (int, float)) and not isinstance(conf, bool) and 0 <= conf < 1):
        bad("runtime.draft_confidence", f"expected a probability in [0, 1) (0 = full blocks), got {conf!r}")
    if cfg.runtime.width_policy not in WIDTH_POLICIES:
        bad("runtime.width_policy", f"expected one of {', '.join(WIDTH_POLICIES)}, got {cfg.runtime.width_policy!r}")
    cache = cfg.runtime.prefix_cache_bytes
    if not (isinstance(cache, int) and not isinstance(cache, bool) and cache >= 0):
        bad("runtime.prefix_cache_bytes", f"expected a number of bytes >= 0 (0 = off), got {cache!r}")
    if not isinstance(cfg.runtime.cuda_graphs, bool):
        bad("runtime.cuda_graphs", f"expected true or false, got {cfg.runtime.cuda_graphs!r}")
    if not isinstance(cfg.runtime.sampled_requests, bool):
        bad("runtime.sampled_requests", f"expected true or false, got {cfg.runtime.sampled_requests!r}")
    vocab = cfg.runtime.draft_vocab_size
    if vocab is not None and vocab < 1:
        bad("runtime.draft_vocab_size", f"expected a positive int (or null = full vocabulary), got {vocab!r}")
    if cfg.runtime.max_seq_len < 16:
        bad("runtime.max_seq_len", f"must be >= 16, got {cfg.runtime.max_seq_len}")
    if cfg.golden.max_new_tokens < 1:
        bad("golden.max_new_tokens", f"must be >= 1, got {cfg.golden.max_new_tokens}")
    if cfg.backend == "torch" and cfg.tp != 1:
        bad("tp", "the torch backend serves tp=1 bundles; build tp>1 checkpoints with `dflash-trt convert --tp`")


def _section(cls, data, where: str, prefix: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: field '{prefix}': expected a mapping, got {data!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{where}: field '{prefix}{unknown[0]}': unknown; allowed: {', '.join(sorted(known))}")
    kwargs = {}
    for key, value in data.items():
        expected = known[key].type
        if value is not None and not _type_ok(value, expected):
            raise ConfigError(f"{where}: field '{prefix}{key}': expected {expected}, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


def _type_ok(value, expected: str) -> bool:
    if "list" in expected:
        return isinstance(value, list)
    if expected.startswith("dict"):
        return isinstance(value, dict)
    if expected.startswith("int"):
        return isinstance(value, int) and not isinstance(value, bool)
    if expected.startswith("float"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected.startswith("str"):
        return isinstance(value, str)
    return True


def load_build_config(path: str | Path) -> BuildConfig:
    """Parse and validate a build YAML; every error names the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level")
    where = str(path)
    for required in ("name", "target", "draft"):
        if required not in data:
            raise ConfigError(f"{where}: field '{required}': missing (required)")
    runtime = _section(RuntimeConfig, data.pop("runtime", None), where, "runtime.")
    golden = _section(GoldenConfig, data.pop("golden", None), where, "golden.")
    cfg = _section(BuildConfig, data, where, "")
    cfg.runtime, cfg.golden, cfg.source = runtime, golden, str(path.resolve())
    _check(cfg, where)
    return cfg


def dump_build_config(cfg: BuildConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
