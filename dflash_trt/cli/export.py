"""`dflash-trt export`: hand a DFlash pair to another runtime (thin commands; logic in dflash_trt.backends.trtllm)."""

from __future__ import annotations

import click

from dflash_trt.cli.types import MODEL_REF


@click.group("export", short_help="Export a DFlash pair for another runtime (TensorRT-LLM llmapi).")
def export_group():
    """Write what another runtime needs to serve a target + DFlash drafter pair."""


@export_group.command("trtllm-llmapi", short_help="Triton repository for TensorRT-LLM's native DFlash (llmapi).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="A build config (build_configs/*.yaml): target, draft, block size, limits, quant.")
@click.option("--target", type=MODEL_REF,
              help="Target: local HF folder, builtin:NAME or Hugging Face id (overrides the config's).")
@click.option("--draft", type=MODEL_REF,
              help="DFlash drafter: local folder, builtin:NAME or Hugging Face id (overrides the config's).")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Repository folder (gets tensorrt_llm/).")
@click.option("--block-size", type=click.IntRange(min=2), help="Verify width; max_draft_len = block_size - 1.")
@click.option("--max-seq-len", type=click.IntRange(min=16), help="Prompt + output tokens per request.")
@click.option("--max-batch-size", type=click.IntRange(min=1))
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel GPUs (tensor_parallel_size).")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel stages (pipeline_parallel_size), e.g. one per node.")
@click.option("--ep", type=click.IntRange(min=1), help="Expert-parallel ranks of a MoE target (moe_expert_parallel_size).")
@click.option("--trtllm-version", help="TensorRT-LLM release the server runs: which speculative_config fields "
              "model.yaml may carry (default: the installed release, else the documented pin).")
@click.option("--kv-cache", type=click.Choice(["auto", "fp8"]))
@click.option("--kv-block-reuse/--no-kv-block-reuse", default=False, show_default=True,
              help="TensorRT-LLM's prefix cache (enable_block_reuse). On: shared prompt prefixes skip the target's "
              "prefill, but TensorRT-LLM's DFlash drafter loses their context, so acceptance falls on every hit.")
@click.option("--gpu-arch", default="auto", show_default=True,
              help="The server GPU: auto (this machine's), sm90 (Hopper), sm100/sm103 (Blackwell), sm120, ...")
@click.option("--llmapi-dir", type=click.Path(exists=True, file_okay=False),
              help="TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm (model.py, helpers.py, config.pbtxt).")
def llmapi_command(config_path, target, draft, out, block_size, max_seq_len, max_batch_size, tp, pp, ep, trtllm_version,
                   kv_cache, kv_block_reuse, gpu_arch, llmapi_dir):
    """Write OUT/tensorrt_llm: config.pbtxt + 1/model.yaml with speculative_config {decoding_type: DFlash}."""
    from dflash_trt.backends.trtllm import llmapi, llmapi_fields

    arch = llmapi.detect_gpu_arch() if gpu_arch == "auto" else gpu_arch
    version = trtllm_version or llmapi_fields.default_version(llmapi.installed_llmapi_version())
    overrides = dict(target=target, draft=draft, block_size=block_size, max_seq_len=max_seq_len,
                     max_batch_size=max_batch_size, tp=tp, pp=pp, ep=ep, kv_cache=kv_cache, trtllm_version=version,
                     kv_block_reuse=kv_block_reuse)
    if config_path:
        from dflash_trt.engine.config import load_build_config

        export = llmapi.from_build_config(load_build_config(config_path), arch, **overrides)
    else:
        if not (target and draft):
            raise click.UsageError("give --config, or --target and --draft")
        block_size = block_size or llmapi.draft_block_size(draft)
        if block_size is None:
            raise click.UsageError(f"--block-size is required ({draft} has no local config.json to read it from)")
        export = llmapi.LlmapiExport(target=target, draft=draft, block_size=block_size,
                                     max_seq_len=max_seq_len or 4096, max_batch_size=max_batch_size or 8,
                                     gpu_arch=arch, tp=tp or 1, pp=pp or 1, ep=ep, kv_cache=kv_cache or "auto",
                                     trtllm_version=version, kv_block_reuse=kv_block_reuse)
    folder = llmapi.write_repository(export, out, llmapi_dir)
    spec = llmapi.speculative_config(export)
    click.echo(f"repository: {folder.parent} (model tensorrt_llm, DFlash max_draft_len {export.block_size - 1}, "
               f"attention_backend {spec.get('attention_backend', '(not a field of this release)')}, "
               f"for tensorrt-llm {export.trtllm_version}, {export.tp * export.pp} GPU(s): tp {export.tp} x pp {export.pp})")
    if export.tp * export.pp > 1:
        click.echo("launch: docs/trtllm-backend.md, multi-GPU and multi-node (TensorRT-LLM's launcher, MPI)", err=True)
    click.echo(llmapi.REUSED_PREFIX_COST.format(state="on" if export.kv_block_reuse else
                                               "off (--kv-block-reuse turns it on)"), err=True)
    window_cost = llmapi.windowed_drafter_cost(export.draft)
    if window_cost:
        click.echo(window_cost, err=True)
    if llmapi_dir is None:
        click.echo("next: copy model.py and helpers.py from TensorRT-LLM's llmapi model (see 1/README.txt)", err=True)
