"""`dflash-trt check-pair`: the pair mismatches users hit after deploying, checked before.

Static checks (also run by `build`, which warns): both configs read as z-lab / HF read them; hidden size,
vocabulary, target depth, taps and mask token agree; the tap convention (feature i = the target's
`hidden_states[i + 1]`, the output of decoder layer i, z-lab's `extract_context_feature`); stop tokens
(config.json + generation_config.json + the tokenizer); what the drafter's card says about chat templates
and thinking mode; the same pair's launch settings in TensorRT-LLM, vLLM and SGLang units (block size vs
drafts per step, a unit users commonly confuse between engines).

The measured checks (τ raw, chat-templated and with shifted taps) decode, so they live above the engine:
bench/check_pair.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import DFlashTrtError

OK, WARN, FAIL = "ok", "warn", "fail"
CARD_HINTS = re.compile(r"[^.\n]*(enable_thinking|thinking|chat[ _-]template|apply_chat_template|raw prompts?)[^.\n]*",
                        re.IGNORECASE)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str


def launch_settings(block_size: int) -> str:
    """The pair's verify width in each engine's own unit (a block of B = 1 bonus + B - 1 drafts)."""
    return (f"TensorRT-LLM max_draft_len: {block_size - 1}; vLLM speculative_config num_speculative_tokens: "
            f"{block_size - 1} (drafts per step); SGLang --speculative-num-draft-tokens {block_size} (the block)")


def static_checks(target_dir, draft_dir) -> list[Check]:
    """Every check that needs no forward pass; a failed read stops the list there."""
    from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
    from dflash_trt.tokenizer import has_tokenizer, load_tokenizer, stop_token_ids

    checks = []
    try:
        target = read_target(target_dir)
    except DFlashTrtError as exc:
        return [Check("target", FAIL, exc.format_message())]
    t = target.config
    checks.append(Check("target", OK, f"{t.family}, {t.dims.num_layers} layers, hidden {t.dims.hidden_size}, "
                                      f"vocab {t.vocab_size}"))
    try:
        draft = read_draft(draft_dir)
    except DFlashTrtError as exc:
        return checks + [Check("drafter", FAIL, exc.format_message())]
    d = draft.config
    kind = "DFlash2 (convolutions + candidate selector)" if d.is_dflash2 else "DFlash"
    checks.append(Check("drafter", OK, f"{kind}, {d.dims.num_layers} layers, block size {d.block_size}, "
                                       f"{sum(x == 'sliding_attention' for x in d.layer_types)} sliding layers"))
    try:
        check_pair(target, draft)
        checks.append(Check("shapes", OK, f"hidden {d.dims.hidden_size}, vocab {d.vocab_size}, "
                                          f"num_target_layers {d.num_target_layers or '-'} match the target"))
    except DFlashTrtError as exc:
        return checks + [Check("shapes", FAIL, exc.format_message())]
    checks.append(Check("taps", OK, f"target layers {list(d.target_layer_ids)}: feature i = hidden_states[i + 1] "
                                    "(the output of decoder layer i, z-lab's convention)"))
    tokenizer = load_tokenizer(target_dir) if has_tokenizer(target_dir) else None
    checks.append(_mask_check(d.mask_token_id, tokenizer))
    stops = sorted(stop_token_ids(tokenizer, t.eos_token_ids))
    checks.append(Check("stop tokens", OK if stops else WARN,
                        f"{stops} (config.json, generation_config.json, tokenizer)" if stops else
                        "none: requests end only at max_tokens or a stop word"))
    checks.append(_prompt_format_check(tokenizer, Path(draft_dir)))
    checks.append(Check("launch settings", OK, launch_settings(d.block_size)))
    return checks


def _mask_check(mask_id: int, tokenizer) -> Check:
    if tokenizer is None:
        return Check("mask token", OK, f"id {mask_id} (no tokenizer to name it)")
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    piece = tokenizer.convert_ids_to_tokens(mask_id) if mask_id < len(tokenizer) else None
    if mask_id in special or piece is None:
        return Check("mask token", OK, f"id {mask_id} ({piece or 'beyond the tokenizer: a reserved row'})")
    return Check("mask token", WARN, f"id {mask_id} is the ordinary token {piece!r}: z-lab drafters use a reserved "
                                     "or special token; check the drafter was trained with this id")


def _prompt_format_check(tokenizer, draft_dir: Path) -> Check:
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    said = []
    for name in ("README.md", "config.json"):
        path = draft_dir / name
        if path.is_file():
            said += [m.group(0).strip() for m in CARD_HINTS.finditer(path.read_text(errors="replace"))][:2]
    parts = ["target tokenizer: " + ("a chat template" + (" with enable_thinking" if template and
                                                            "enable_thinking" in template else "") if template
                                     else "no chat template (raw prompts only)")]
    parts.append("drafter card: " + ("; ".join(said)[:300] if said else "says nothing about chat / thinking mode"))
    return Check("prompt format", OK if said or not template else WARN, ". ".join(parts))


def verdict(checks: list[Check]) -> str:
    if any(c.status == FAIL for c in checks):
        return FAIL
    return WARN if any(c.status == WARN for c in checks) else OK
