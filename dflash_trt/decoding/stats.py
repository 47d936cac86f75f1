"""Decoding statistics: mean acceptance length τ, per-position acceptance, throughput."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dflash_trt.decoding.requests import GenerationResult


@dataclass
class DecodeStats:
    requests: int
    generated_tokens: int
    verify_steps: int  # target verify passes (0 for autoregressive decoding)
    mean_acceptance_length: float  # τ: committed tokens per verify step
    per_position_acceptance: list[float]  # [K] P(draft i accepted), i = 1..K
    prefill_s: float
    decode_s: float

    @property
    def tokens_per_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return self.generated_tokens / total if total > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {"tokens_per_s": self.tokens_per_s}

    @classmethod
    def of(cls, results: list[GenerationResult], block_size: int, prefill_s: float, decode_s: float) -> "DecodeStats":
        lengths = [n for r in results for n in r.acceptance_lengths]
        accepted = [a for r in results for a in r.accepted_drafts]
        k = max(block_size - 1, 0)
        per_position = [sum(a >= i for a in accepted) / len(accepted) if accepted else 0.0 for i in range(1, k + 1)]
        return cls(
            requests=len(results),
            generated_tokens=sum(len(r.tokens) for r in results),
            verify_steps=len(lengths),
            mean_acceptance_length=sum(lengths) / len(lengths) if lengths else 0.0,
            per_position_acceptance=per_position,
            prefill_s=prefill_s,
            decode_s=decode_s,
        )
