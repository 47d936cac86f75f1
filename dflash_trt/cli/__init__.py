"""The `dflash-trt` command line: one click group, one thin command per pipeline stage.

Each command parses options, calls one library function and prints. Heavy imports (torch,
transformers, tritonclient, tensorrt_llm) happen inside commands, so `--help` is instant and
works without any GPU stack. Every option can also come from a `DFLASH_TRT_*` variable.

One module per command group, in pipeline order:

    convert.py   convert                 HF pair -> TensorRT-LLM checkpoint pair
    build.py     build, publish, regress  engine bundle, Triton repository, regression builds
    serve.py     serve                   tritonserver on a repository
    generate.py  generate (+ report.py)  one prompt, local or served
    bench.py     bench                   DFlash vs autoregressive, side by side
    train.py     train-draft, draft-vocab
    export.py    export trtllm-llmapi    TensorRT-LLM's native DFlash
    doctor.py    doctor                  what this machine has
    check_pair.py check-pair             a target + drafter pair, before deploying it

Nothing below this package imports it.
"""

from __future__ import annotations

import click

from dflash_trt import __version__
from dflash_trt.cli.bench import bench_command
from dflash_trt.cli.build import build_command, publish_command, regress_command
from dflash_trt.cli.check_pair import check_pair_command
from dflash_trt.cli.convert import convert_command
from dflash_trt.cli.doctor import doctor_command
from dflash_trt.cli.export import export_group
from dflash_trt.cli.generate import generate_command
from dflash_trt.cli.serve import serve_command
from dflash_trt.cli.train import draft_vocab_command, train_draft_command


@click.group(context_settings={"auto_envvar_prefix": "DFLASH_TRT", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dflash-trt")
def cli():
    """Build, serve and benchmark DFlash speculative decoding (TensorRT-LLM + Triton)."""


for _command in (generate_command, build_command, publish_command, serve_command, regress_command,
                 train_draft_command, draft_vocab_command, bench_command, convert_command, export_group,
                 doctor_command, check_pair_command):
    cli.add_command(_command)


def main():
    cli()


__all__ = ["cli", "main", "generate_command"]
