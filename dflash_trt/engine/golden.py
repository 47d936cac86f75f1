"""Golden outputs: fixed prompts decoded greedily at build time and recorded in the manifest.

Regression builds compare a fresh bundle's golden tokens and mean acceptance length against a
committed baseline. Prompt entries: `builtin:heldout[:N]` (the shipped pair's held-out prompts),
`{"token_ids": [...]}`, `{"text": "..."}` or a plain string. The decoding itself is the runtime's
(runtime/golden.py: the bundle's own runners, as a server runs them).
"""

from __future__ import annotations

import re
from pathlib import Path

from dflash_trt.checkpoint.json_fields import jsonl_records
from dflash_trt.errors import ConfigError

HELDOUT = Path(__file__).resolve().parent.parent / "assets" / "heldout_prompts.jsonl"
HELDOUT_LONG = HELDOUT.with_name("heldout_long.jsonl")  # held-out files in file order: prompts of any length


def builtin_prompts(limit: int | None = None) -> list[dict]:
    if not HELDOUT.is_file():
        raise ConfigError(f"{HELDOUT}: the shipped held-out prompts are missing")
    records = [record for _, record in jsonl_records(HELDOUT)]
    return records[:limit] if limit else records


def prompt_ids(entries: list, tokenizer, where: str) -> list[list[int]]:
    """Token ids for each prompt entry of a config's `golden.prompts`."""
    out = []
    for entry in entries:
        if isinstance(entry, str) and entry.startswith("builtin:heldout"):
            m = re.fullmatch(r"builtin:heldout(?:\[:(\d+)\])?", entry)
            if not m:
                raise ConfigError(f"{where}: field 'golden.prompts': bad builtin spec {entry!r}; e.g. builtin:heldout[:4]")
            out += [r["token_ids"] for r in builtin_prompts(int(m.group(1)) if m.group(1) else None)]
        elif isinstance(entry, dict) and "token_ids" in entry:
            out.append([int(t) for t in entry["token_ids"]])
        elif isinstance(entry, (str, dict)):
            text = entry if isinstance(entry, str) else entry.get("text")
            if tokenizer is None or not isinstance(text, str):
                raise ConfigError(f"{where}: field 'golden.prompts': {entry!r} needs 'token_ids' (or a tokenizer)")
            out.append(tokenizer.encode(text, add_special_tokens=False))
        else:
            raise ConfigError(f"{where}: field 'golden.prompts': unsupported entry {entry!r}")
    return out


def golden_block(prompts: list[list[int]], spec, ar, max_new_tokens: int, block_size: int) -> dict:
    """The manifest's `golden` block from speculative (`spec`) and autoregressive (`ar`) results."""
    lengths = [n for r in spec for n in r.acceptance_lengths]
    return {
        "max_new_tokens": max_new_tokens,
        "block_size": block_size,
        "outputs": [{"prompt_ids": p, "token_ids": r.tokens, "acceptance_lengths": r.acceptance_lengths}
                    for p, r in zip(prompts, spec)],
        "mean_acceptance_length": sum(lengths) / len(lengths) if lengths else 0.0,
        "matches_autoregressive": [r.tokens for r in spec] == [r.tokens for r in ar],
    }
