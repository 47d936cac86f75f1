"""Target features for drafter training: the frozen target's tapped hidden states of every training row,
computed once for a dataset (in memory, optionally cached on disk) or per batch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch


class TargetFeatures:
    """`target_hidden` [B, S, n*H] of training rows from the frozen target: computed once for the whole
    dataset when it fits in `budget_bytes` (the target then runs once, not once per step), else per batch.
    With `cache_file` the whole-dataset table is read from there when present, else written there.
    `contexts` (one token list per row, or None): tokens the target reads before each row, at the positions
    before it; the row's features are its own positions' (a row after a long prefix, for windowed drafters)."""

    def __init__(self, target, tokens: torch.Tensor, taps: tuple[int, ...], budget_bytes: float = 4e9, chunk: int = 16,
                 cache_file: Path | None = None, final: bool = False, contexts: list[list[int]] | None = None):
        """`final`: also the target's final-norm hidden state (the distillation loss's teacher), appended
        after the taps' columns (and cached with them)."""
        self.target, self.tokens, self.taps, self.final = target, tokens, taps, final
        self.contexts = contexts
        self.device = target.lm_head.weight.device
        need = tokens.numel() * (len(taps) + final) * target.config.dims.hidden_size * 4
        self.table = None
        if need <= budget_bytes:
            if cache_file is not None and cache_file.is_file():
                from safetensors.torch import load_file

                self.table = load_file(str(cache_file))["features"].to(self.device)
                return
            for i in range(0, len(tokens), chunk):  # filled in place: no second copy of the table at its peak
                part = self._compute(torch.arange(i, min(i + chunk, len(tokens))))
                if self.table is None:
                    self.table = torch.empty(len(tokens), *part.shape[1:], dtype=part.dtype, device=part.device)
                self.table[i : i + len(part)] = part
            if cache_file is not None:
                from safetensors.torch import save_file

                cache_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache_file.with_suffix(".tmp")
                save_file({"features": self.table.cpu().contiguous()}, str(tmp))
                tmp.replace(cache_file)

    def _compute(self, rows: torch.Tensor) -> torch.Tensor:
        if self.contexts is None:
            return self._forward(self.tokens[rows])
        plain = [int(r) for r in rows if not self.contexts[r]]
        parts = dict(zip(plain, self._forward(self.tokens[plain]))) if plain else {}
        for r in (int(r) for r in rows if self.contexts[r]):  # one at a time: contexts differ in length
            context = torch.tensor(self.contexts[r], dtype=self.tokens.dtype)
            parts[r] = self._forward(torch.cat([context, self.tokens[r]])[None])[0, len(context) :]
        return torch.stack([parts[int(r)] for r in rows])

    @torch.no_grad()
    def _forward(self, batch: torch.Tensor) -> torch.Tensor:
        b, s = batch.shape
        cache = self.target.new_cache(b, s)
        positions = torch.arange(s, device=self.device)[None].expand(b, -1)
        slots = torch.arange(b, device=self.device)
        if self.final:  # head=False: the final-norm hidden rows instead of logits
            final, hidden = self.target(batch.to(self.device), positions, cache, slots, self.taps, head=False)
            return torch.cat([hidden, final], dim=-1)
        _, hidden = self.target(batch.to(self.device), positions, cache, slots, self.taps, logit_rows=positions[:, :1])
        return hidden

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if self.table is not None:
            return self.table[rows.to(self.table.device)]
        return self._compute(rows)


def features_cache_file(target_folder: str, taps: tuple[int, ...], tokens: torch.Tensor, final: bool = False,
                        contexts: list[list[int]] | None = None) -> Path:
    """Where `--cache-features` keeps a dataset's target features: named by a hash of the target's
    weights and config, the taps, the packed tokens and their contexts ($DFLASH_TRT_CACHE_DIR, default
    ~/.cache/dflash_trt)."""
    digest = hashlib.sha256()
    folder = Path(target_folder)
    for path in sorted(folder.glob("*.safetensors")) + [folder / "config.json"]:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    digest.update(json.dumps(list(taps) + (["final"] if final else [])).encode())
    digest.update(str(tuple(tokens.shape)).encode())
    digest.update(tokens.to(torch.int64).contiguous().numpy().tobytes())
    if contexts is not None:
        digest.update(json.dumps(contexts, separators=(",", ":")).encode())
    from dflash_trt.host_build import cache_home

    return cache_home() / "train_features" / f"{digest.hexdigest()[:32]}.safetensors"
