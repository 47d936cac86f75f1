"""The target engine's build: the `trtllm-build` invocation, its model class file and settings.

`trtllm_build_args(...)` is the argv (flags only; run as `python -m tensorrt_llm.commands.build`,
the module behind the `trtllm-build` console script). Flag names and values follow TensorRT-LLM
1.2.1's parser: tensorrt_llm/commands/build.py `parse_arguments` and plugin/plugin.py
`add_plugin_argument` (booleans `enable` / `disable`; `--gemm_plugin` auto / fp8 / nvfp4 / ...).
Deliberately absent: `--speculative_decoding_mode` (drafts travel in the prompt) and
`--gather_context_logits` (taps are our own outputs). docs/trtllm-backend.md explains each choice.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dflash_trt.backends.trtllm.io_spec import DraftGraphSpec, TargetOutputs
from dflash_trt.backends.trtllm.plugin import DFLASH_VERIFY, LIBRARY_NAME
from dflash_trt.errors import ConfigError, DFlashTrtError

MODEL_CLS_SOURCE = Path(__file__).with_name("target_model_cls.py")
MODEL_CLS_FILE = "dflash_target_model.py"
SETTINGS_FILE = "dflash_target.json"
CLASS_NAMES = {"qwen3": "DFlashQwen3ForCausalLM", "llama": "DFlashLlamaForCausalLM"}
GEMM_PLUGIN = {"none": "auto", "fp8": "fp8", "nvfp4": "nvfp4"}  # by build-config quant
TRT_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
TOKENS_PER_BLOCK = 32


def class_name(family: str) -> str:
    if family not in CLASS_NAMES:
        raise ConfigError(f"target family {family!r} has no DFlash engine class; supported: {sorted(CLASS_NAMES)}")
    return CLASS_NAMES[family]


def engine_lengths(max_seq_len: int, block_size: int, max_batch_size: int) -> dict[str, int]:
    """Prompt-append sends history + K drafts as input every step and asks for one token.

    max_num_tokens, chosen deliberately (every additional output costs max_num_tokens rows of GPU memory,
    `TargetOutputs.reserved_bytes`): the largest step the runner sends, which is the larger of one
    whole prompt (no chunked context: a prompt's rows arrive in one step) and a full batch of verifies,
    each recomputing its block plus the partial KV block before it (reuse is by whole blocks of
    TOKENS_PER_BLOCK tokens)."""
    max_input_len = max_seq_len + block_size + 1
    verifies = max_batch_size * (block_size + TOKENS_PER_BLOCK - 1)
    return {"max_input_len": max_input_len, "max_seq_len": max_input_len + 1,
            "max_num_tokens": max(max_input_len, verifies)}


def trtllm_build_args(checkpoint_dir: Path, output_dir: Path, family: str, quant: str, kv_cache: str,
                      max_batch_size: int, max_seq_len: int, block_size: int) -> list[str]:
    """Flags for trtllm-build (TensorRT-LLM 1.2.1) building the DFlash target engine."""
    lengths = engine_lengths(max_seq_len, block_size, max_batch_size)
    args = [
        "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir),
        "--model_cls_file", str(output_dir / MODEL_CLS_FILE), "--model_cls_name", class_name(family),
        "--workers", "1",  # the class comes from a file loaded by path: no spawn pool
        "--max_batch_size", str(max_batch_size), "--max_beam_width", "1",
        "--max_input_len", str(lengths["max_input_len"]), "--max_seq_len", str(lengths["max_seq_len"]),
        "--max_num_tokens", str(lengths["max_num_tokens"]),
        "--kv_cache_type", "paged", "--use_paged_context_fmha", "enable",  # KV reuse (prompt-append)
        "--remove_input_padding", "enable", "--context_fmha", "enable",
        "--gpt_attention_plugin", "auto", "--gemm_plugin", GEMM_PLUGIN[quant],
        "--tokens_per_block", str(TOKENS_PER_BLOCK), "--logits_dtype", "float32",
    ]
    if kv_cache == "fp8":
        args += ["--use_fp8_context_fmha", "enable"]
    return args


def target_outputs(draft: DraftGraphSpec, dtype: str, sampled: bool) -> TargetOutputs:
    return TargetOutputs(draft.n_taps, draft.hidden_size, draft.vocab_size, draft.block_size, dtype, sampled)


def target_settings(family: str, draft: DraftGraphSpec, target_num_layers: int, dtype: str,
                    sampled: bool = False) -> dict:
    """dflash_target.json: what the model class file needs at build time."""
    outputs = target_outputs(draft, dtype, sampled)
    return {
        "format": "dflash-trt/target-model-class",
        "family": family,
        "class_name": class_name(family),
        "target_layer_ids": list(draft.target_layer_ids),
        "num_layers": target_num_layers,
        "hidden_size": draft.hidden_size,
        "vocab_size": draft.vocab_size,
        "block_size": draft.block_size,
        "num_drafts": draft.num_drafts,
        "mask_token_id": draft.mask_token_id,
        "dtype": TRT_DTYPES[dtype],
        "sampled": sampled,  # the engine also emits dflash_tail_logits (runtime.sampled_requests)
        "tokens_per_block": TOKENS_PER_BLOCK,  # its KV blocks: the runner mirrors which ones the engine may reuse
        "plugin_library": f"../plugin/{LIBRARY_NAME}",  # relative to this file's folder
        "plugin": {"name": DFLASH_VERIFY.name, "version": DFLASH_VERIFY.version,
                   "namespace": DFLASH_VERIFY.namespace},
        "outputs": outputs.to_list(),
    }


def write_model_class(output_dir: Path, settings: dict) -> Path:
    """Copy the model class file and its settings into the engine folder trtllm-build writes to."""
    import json

    output_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(MODEL_CLS_SOURCE, output_dir / MODEL_CLS_FILE)
    (output_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    return output_dir / MODEL_CLS_FILE


def run_trtllm_build(args: list[str], log=print) -> None:
    """Run trtllm-build in this interpreter's environment; a failure raises with the command."""
    command = [sys.executable, "-m", "tensorrt_llm.commands.build", *args]
    log("trtllm-build " + " ".join(args))
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise DFlashTrtError(f"trtllm-build failed (exit {done.returncode}); the command was: trtllm-build "
                          f"{' '.join(args)}")
