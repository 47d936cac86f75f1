"""Draft vocabulary: the tokens a drafter's head scores, most frequent first.

The drafter proposes tokens through the target's lm_head. Scoring only the tokens the target
actually emits (frequency-ranked, as EAGLE-3's reduced draft vocabulary and FR-Spec do) reads a
fraction of the head's weights per step, which pays where a draft step is bound by reading weights
(CPUs). It is lossless: a token outside the draft vocabulary is never proposed, and the verify
pass — always over the full vocabulary — decides every committed token.

The file `dflash_trt_draft_vocab.json` sits in the drafter folder (z-lab's loader ignores it):
    {"format": "dflash-trt draft vocabulary", "version": 1, "vocab_size": V,
     "token_ids": [...most frequent first...], "counts": [...], "recommended_size": N, "source": "..."}
`train-draft` writes it from the tokens it trains on; `dflash-trt draft-vocab` writes it for any
drafter from token data.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from dflash_trt.errors import CheckpointError, ConfigError

VOCAB_FILE = "dflash_trt_draft_vocab.json"
FORMAT = "dflash-trt draft vocabulary"
COVERAGE = 0.999  # the recommended size covers this share of the counted tokens
MIN_SIZE = 64


def count_tokens(sequences: Iterable[Iterable[int]]) -> Counter:
    counts: Counter = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    return counts


def vocab_record(counts: Counter, vocab_size: int, source: str, coverage: float = COVERAGE) -> dict:
    """Token ids by descending count (ties: lower id first) and the smallest size covering `coverage`."""
    bad = [t for t in counts if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"draft vocabulary: token ids {sorted(bad)[:5]} outside the vocabulary 0..{vocab_size - 1}")
    if not counts:
        raise ConfigError("draft vocabulary: no tokens counted (empty data)")
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    total, running, size = sum(counts.values()), 0, len(ranked)
    for i, (_, c) in enumerate(ranked, 1):
        running += c
        if running >= coverage * total:
            size = i
            break
    return {"format": FORMAT, "version": 1, "vocab_size": vocab_size,
            "token_ids": [t for t, _ in ranked], "counts": [c for _, c in ranked],
            "recommended_size": min(len(ranked), max(size, MIN_SIZE)), "coverage": coverage, "source": source}


def read_vocab_file(folder: str | Path) -> dict | None:
    """The drafter folder's draft vocabulary record, None when it has none; checked field by field."""
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc

    def bad(field: str, problem: str):
        raise CheckpointError(f"{path}: field '{field}': {problem}")

    if not isinstance(record, dict) or record.get("format") != FORMAT:
        bad("format", f"expected {FORMAT!r}")
    vocab = record.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        bad("vocab_size", f"expected a positive int, got {vocab!r}")
    ids = record.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
        bad("token_ids", f"expected a non-empty list of token ids in 0..{vocab - 1}")
    if len(set(ids)) != len(ids):
        bad("token_ids", "repeated token ids")
    size = record.get("recommended_size")
    if not isinstance(size, int) or not 1 <= size <= len(ids):
        bad("recommended_size", f"expected an int in 1..{len(ids)}, got {size!r}")
    return record


def select(record: dict | None, size: int | str | None, where: str) -> list[int] | None:
    """The token ids a draft head should score: `size` None/0 = full vocabulary (None returned),
    "auto" = the record's recommended size (full vocabulary without a record), N = the N most
    frequent (the record must exist and hold N tokens)."""
    if size in (None, 0, "full"):
        return None
    if size == "auto":
        return None if record is None else record["token_ids"][: record["recommended_size"]]
    if not isinstance(size, int) or size < 1:
        raise ConfigError(f"{where}: draft vocabulary size: expected 'auto', 'full' or a positive int, got {size!r}")
    if record is None:
        raise ConfigError(f"{where}: draft vocabulary size {size} asked, but the drafter has no {VOCAB_FILE}; "
                          "write one with `dflash-trt draft-vocab` (or use the full vocabulary)")
    if size >= record["vocab_size"]:
        return None
    if size > len(record["token_ids"]):
        raise ConfigError(f"{where}: draft vocabulary size {size}: the drafter's {VOCAB_FILE} ranks only "
                          f"{len(record['token_ids'])} tokens")
    return record["token_ids"][:size]


def token_ids(folder: str | Path, size: int | str | None, vocab_size: int, where: str) -> list[int] | None:
    """`select` over the drafter folder's vocabulary file, checked against the target's `vocab_size`."""
    record = read_vocab_file(folder)
    if record is not None and record["vocab_size"] != vocab_size:
        raise ConfigError(f"{Path(folder) / VOCAB_FILE}: field 'vocab_size': {record['vocab_size']} "
                          f"is not the target's vocabulary size {vocab_size}")
    return select(record, size, where)


def write_vocab_file(folder: str | Path, record: dict) -> Path:
    """Write (replace) the record atomically inside an existing drafter folder."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder}: not a drafter folder (no config.json)")
    path = folder / VOCAB_FILE
    tmp = folder / f".{VOCAB_FILE}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)
    return path
