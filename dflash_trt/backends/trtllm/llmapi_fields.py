"""Which `speculative_config` fields each TensorRT-LLM release's DFlashDecodingConfig has (route B).

`DecodingBaseConfig` is a `StrictBaseModel` (`extra = "forbid"`, tensorrt_llm/llmapi/llm_args.py): a key
the installed release does not declare fails the llmapi model's `LLM(**model.yaml)` at load. So the
export emits a field only where the target release has it, from this table read from upstream sources:

| release | DFlash fields | source |
|---|---|---|
| (first DFlash, PR #12794, ~1.3.0rc13-15) | mask_token_id, target_layer_ids | tensorrt_llm/llmapi/llm_args.py, DFlashDecodingConfig (no attention_backend) |
| 1.3.0rc27 | + attention_backend (VANILLA, TRTLLM, FA4) | API reference 1.3.0rc27, DFlashDecodingConfig |
| 1.4.0rc1 | + spec_dec_variant, context_recompute_tail, skip_ctx_buffer_budget_check | API reference 1.4.0rc1 |

The releases between the first DFlash one and 1.3.0rc27 have no field list this table can vouch for,
so they are refused (`check_release`), not guessed. `draft_len_schedule` has upstream's upper-bound keys in
every release listed (since 1.3.0rc8, PR #10860).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.backends.trtllm.versions import version_tuple
from dflash_trt.errors import ConfigError

# DecodingBaseConfig fields (API reference 1.3.0rc27) plus DFlash's decoding_type
BASE_FIELDS = frozenset({
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency",
    "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
    "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty"})


@dataclass(frozen=True)
class Release:
    version: str  # first release with these fields
    dflash_fields: frozenset  # DFlashDecodingConfig's own fields (beyond BASE_FIELDS)
    attention_backends: tuple[str, ...]  # values attention_backend accepts; () = no such field
    source: str


RELEASES = (
    Release("1.3.0rc27", frozenset({"mask_token_id", "target_layer_ids", "attention_backend"}),
            ("VANILLA", "TRTLLM", "FA4"),
            "https://nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/DFlashDecodingConfig.html"),
    Release("1.4.0rc1", frozenset({"mask_token_id", "target_layer_ids", "attention_backend", "spec_dec_variant",
                                   "context_recompute_tail", "skip_ctx_buffer_budget_check"}),
            ("VANILLA", "TRTLLM", "FA4"),
            "https://nvidia.github.io/TensorRT-LLM/1.4.0rc1/llm-api/reference/DFlashDecodingConfig.html"),
)
FIRST = RELEASES[0].version
PIN = "1.4.0rc1"  # route B's documented pin: the newest TensorRT-LLM on PyPI (December 2026)


def release(version: str) -> Release:
    """The table row that applies to `version` (the newest row at or below it)."""
    check_release(version)
    return [r for r in RELEASES if version_tuple(r.version) <= version_tuple(version)][-1]


def check_release(version: str) -> None:
    if version_tuple(version) == (0,):
        raise ConfigError(f"--trtllm-version {version!r}: not a version (expected e.g. {PIN})")
    if version_tuple(version) < version_tuple(FIRST):
        raise ConfigError(
            f"--trtllm-version {version}: TensorRT-LLM's native DFlash (DFlashDecodingConfig) is documented from "
            f"{FIRST} on; {version} has no DFlash or one whose fields no source we hold pins down (1.2.x is route A, "
            f"`dflash-trt build` with backend: trtllm). Serve with tensorrt-llm>={FIRST} and pass its version")


def fields(version: str) -> frozenset:
    """Every key `speculative_config` may carry for a DFlash config on `version`."""
    return BASE_FIELDS | release(version).dflash_fields


def default_version(installed: str | None) -> str:
    """The release to write for: the installed TensorRT-LLM when there is one, else the documented pin."""
    return installed or PIN
