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
