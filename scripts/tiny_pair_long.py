"""make_tiny_pair's long-data stage: the target's own continuations of long prompts, for a windowed drafter.

A drafter whose context attention is windowed reads only the target's hidden states of its last W positions,
but those states carry everything the target read before them: after a prefix of 8,000 tokens they differ from
the ones after 200 (YaRN's interpolated rotations, attention spread over far context, text copied from far
back). Samples regenerated after 64-token prompts never show them. Each sample here is a prompt of L tokens
cut from the training stream, continued greedily by the target, written with `drafter_from = L - W`: the target
reads the whole sample, the drafter's training row starts W positions before the continuation (train-draft's
`drafter_from`). Lines are appended as each batch finishes, so an interrupted stage resumes.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

# prompt length -> samples: most at the lengths agents' prompts have, some at the longest the shipped pair serves
LENGTHS = {512: 64, 1024: 64, 2048: 64, 3072: 32, 4096: 48, 6144: 16, 8000: 16}


def long_samples(work: Path, stream, new_tokens: int, window: int, seed: int, lengths: dict[int, int] = LENGTHS,
                 batch: int = 8, name: str = "draft_long.jsonl") -> Path:
    """Append to `work/name` the samples of `lengths` not written yet (prompts drawn from `stream`, a seeded
    order, so a resumed stage draws the same ones)."""
    from dflash_trt.model.loader import load_pair
    from dflash_trt.train import data as train_data

    pair = load_pair(str(work / "target"), None, dtype="fp32", device="cpu")
    stop_ids = frozenset(pair.target.config.eos_token_ids)
    if any(n % batch for n in lengths.values()):
        raise SystemExit(f"long data: each length's count must be a multiple of the batch ({batch}): {lengths}")
    rng = random.Random(seed)
    plan = [(length, rng.randrange(length, len(stream))) for length, n in lengths.items() for _ in range(n)]
    path = work / name
    done = len(path.read_text().splitlines()) if path.is_file() else 0
    t0 = time.perf_counter()
    for start in range(done - done % batch, len(plan), batch):
        group = plan[start : start + batch]
        length = group[0][0]  # one prompt length per batch
        prompts = [train_data.Sample(stream[end - length : end].tolist(), length) for _, end in group]
        samples = train_data.regenerate(pair.target, prompts, length, new_tokens, 0.0, seed + start, batch_size=batch,
                                        stop_ids=stop_ids)
        with path.open("a") as f:
            for s in samples:
                f.write(json.dumps({"token_ids": s.tokens, "trained_from": length,
                                    "drafter_from": max(0, length - window)}, separators=(",", ":")) + "\n")
        print(f"long data: {start + len(group)}/{len(plan)} samples (prompts of {length}), "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    return path
