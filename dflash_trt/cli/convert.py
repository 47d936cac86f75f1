"""`dflash-trt convert`: HF target + DFlash drafter -> TensorRT-LLM checkpoint pair (thin command)."""

from __future__ import annotations

import click

from dflash_trt.checkpoint.quant.modes import HANDLERS, KV_CACHE_MODES
from dflash_trt.checkpoint.trtllm_config import DTYPE_NAMES
from dflash_trt.cli.types import MODEL_DIR


@click.command("convert", short_help="Convert an HF target + DFlash drafter to a TensorRT-LLM checkpoint pair.")
@click.option("--target", type=MODEL_DIR, required=True, help="HF target folder.")
@click.option("--draft", type=MODEL_DIR, required=True, help="z-lab DFlash drafter folder.")
@click.option("--out", type=click.Path(), required=True, help="Output folder (gets target/ and draft/).")
@click.option("--dtype", type=click.Choice(sorted(DTYPE_NAMES)), default="bf16", show_default=True,
              help="Storage dtype of tensors that are not quantized.")
@click.option("--quant", type=click.Choice(sorted(HANDLERS)), default="none", show_default=True,
              help="Weight + activation quantization of decoder linears.")
@click.option("--kv-cache", type=click.Choice(sorted(KV_CACHE_MODES)), default="none", show_default=True)
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--calib-data", type=click.Path(dir_okay=False),
              help="Calibration prompts: .jsonl ({'ids': [...]}, {'token_ids': [...]} or {'text': ...} "
                   "per line) or .txt (one prompt per line).")
@click.option("--calib-samples", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--calib-new-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="Tokens decoded per calibration prompt.")
@click.option("--calibrator", type=click.Choice(["auto", "builtin", "modelopt"]), default="auto",
              show_default=True, help="auto = nvidia-modelopt when installed.")
def convert_command(target, draft, out, dtype, quant, kv_cache, tp, calib_data, calib_samples, calib_new_tokens,
                    calibrator):
    """Write OUT/target and OUT/draft in TensorRT-LLM's checkpoint format (config.json + rank{r}.safetensors)."""
    from dflash_trt.convert import ConvertConfig, convert

    config = ConvertConfig(target=target, draft=draft, out=out, dtype=dtype, quant=quant, kv_cache=kv_cache,
                           tp=tp, calib_data=calib_data, calib_samples=calib_samples,
                           calib_new_tokens=calib_new_tokens, calibrator=calibrator)
    if config.needs_calibration and calib_data is None:
        click.echo("warning: calibrating on random token prompts; pass --calib-data for real scales", err=True)
    result = convert(config)
    calibrated = f", calibrated with {result.calibrator}" if result.calibrator else ""
    click.echo(f"wrote {result.out} ({result.rank_files} rank files, tp={tp}, quant={quant}, "
               f"kv-cache={kv_cache}{calibrated}) in {result.seconds:.1f} s")
