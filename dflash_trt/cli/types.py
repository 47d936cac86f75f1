"""Custom click parameter types shared by the commands (importable without the CLI group)."""

from __future__ import annotations

import click


class IntListType(click.ParamType):
    """Comma-separated integers, e.g. `--prompt-ids 1,9,17`."""

    name = "INT,INT,..."

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        try:
            items = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"expected comma-separated integers, got {value!r}", param, ctx)
        if not items:
            self.fail("expected at least one integer", param, ctx)
        return items


INT_LIST = IntListType()


class FloatListType(click.ParamType):
    """Comma-separated non-negative numbers, e.g. `--temperature 0,0.7,1.0`."""

    name = "X,X,..."

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return [float(v) for v in value]
        try:
            items = [float(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"expected comma-separated numbers, got {value!r}", param, ctx)
        if not items or any(not v >= 0 for v in items):
            self.fail(f"expected numbers >= 0, got {value!r}", param, ctx)
        return items


FLOAT_LIST = FloatListType()


class DraftVocabType(click.ParamType):
    """`auto` (the drafter's recommended draft vocabulary, if it has one), `full`, or a token count."""

    name = "auto|full|N"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value in ("auto", "full"):
            return value
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"expected 'auto', 'full' or a positive token count, got {value!r}", param, ctx)
        if n < 1:
            self.fail(f"expected a positive token count, got {n}", param, ctx)
        return n


DRAFT_VOCAB = DraftVocabType()
DRAFT_VOCAB_HELP = ("Tokens the drafter scores when proposing: 'auto' = its dflash_trt_draft_vocab.json's "
                    "recommended size (full vocabulary without one), 'full', or N most frequent (lossless).")


class ModelDirType(click.ParamType):
    """A model folder: a path, or `builtin:NAME` for a model shipped in the package (the tiny pair). Converts to
    the folder's path (a str); an unknown shipped name is a usage error naming the shipped ones (a path is
    checked by the reader, which says what it expected there)."""

    name = "DIR|builtin:NAME"

    def __init__(self, hub_ids: bool = False):
        self.hub_ids = hub_ids  # a value that is neither builtin: nor a local folder passes through (a hub id)

    def convert(self, value, param, ctx):
        from pathlib import Path

        from dflash_trt.engine.config import ASSETS, resolve_model_path

        path = resolve_model_path(str(value), Path.cwd())
        if str(value).startswith("builtin:") and not path.is_dir():
            shipped = sorted(f"builtin:{p.name}" for p in ASSETS.iterdir() if (p / "config.json").is_file())
            self.fail(f"{value!r} is not a shipped model; shipped: {', '.join(shipped)}", param, ctx)
        if self.hub_ids and not str(value).startswith("builtin:") and not path.is_dir():
            return str(value)
        return str(path)


MODEL_DIR = ModelDirType()
MODEL_REF = ModelDirType(hub_ids=True)  # also a Hugging Face id (commands that only write configs for another runtime)
BUILTIN_TARGET, BUILTIN_DRAFT = "builtin:tiny-qwen3", "builtin:tiny-qwen3-dflash"
