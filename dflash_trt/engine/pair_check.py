"""`dflash-trt check-pair`: the pair mismatches users hit after deploying, checked before.

Static checks (also run by `build`, which warns): both configs read as z-lab / HF read them; hidden size,
vocabulary, target depth, taps and mask token agree; the tap convention (feature i = the target's
`hidden_states[i + 1]`, the output of decoder layer i, z-lab's `extract_context_feature`); stop tokens
(config.json + generation_config.json + the tokenizer); what the drafter's card says about chat templates
and thinking mode; the same pair's launch settings in TensorRT-LLM, vLLM and SGLang units (block size vs
drafts per step: shared/reference/ecosystem-2026-12.md, "what users trip over").

Measured checks (`measure`): τ (tokens per verify step) on sample prompts, raw and through the chat
template (each thinking mode the template has), and with the taps one layer lower (`hidden_states[i]`, the
off-by-one of vLLM #40727 / SGLang #32204 / z-lab #156): a drafter trained for the other convention or
the other prompt format shows it here, not in production.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
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


def _prompt_texts(path, tokenizer, limit: int) -> list[str]:
    import json

    from dflash_trt.engine.golden import HELDOUT

    texts = []
    for line in Path(path or HELDOUT).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            text = record.get("text") if isinstance(record, dict) else None
            if text is None and isinstance(record, dict) and "token_ids" in record:
                text = tokenizer.decode(record["token_ids"])
            if text:
                texts.append(text)
    return texts[:limit]


def _tau(pair, prompts: list[list[int]], max_new_tokens: int, block_size: int) -> float:
    from dflash_trt.decoding.decode import speculative_generate
    from dflash_trt.decoding.requests import Request, StopCriteria

    requests = [Request(tuple(p), stop=StopCriteria(max_new_tokens)) for p in prompts if p]
    results = speculative_generate(pair.target, pair.draft, requests, block_size)
    steps = [n for r in results for n in r.acceptance_lengths]
    return sum(steps) / len(steps) if steps else 0.0


def measured_checks(target_dir, draft_dir, prompts_path=None, num_prompts: int = 8, max_new_tokens: int = 64,
                    device: str = "cpu", use: str = "auto") -> tuple[list[Check], dict[str, float]]:
    """τ raw / chat-templated (each thinking mode) / with taps one layer lower; `use` (raw | chat | auto):
    the format requests will use, warned about when another format fits the drafter clearly better."""
    from dflash_trt.runtime.local import load_pair

    pair = load_pair(target_dir, draft_dir, dtype="fp32", device=device)
    tok, block = pair.tokenizer, pair.draft.config.block_size
    if tok is None:
        return [Check("τ", WARN, "the target has no tokenizer: nothing measured")], {}
    texts = _prompt_texts(prompts_path, tok, num_prompts)
    formats = {"raw": [tok.encode(t, add_special_tokens=True) for t in texts]}
    template = getattr(tok, "chat_template", None)
    modes = [None] if template and "enable_thinking" not in template else [False, True] if template else []
    for thinking in modes:
        kwargs = {} if thinking is None else {"enable_thinking": thinking}
        name = "chat" if thinking is None else f"chat, thinking {'on' if thinking else 'off'}"
        formats[name] = [_chat_ids(tok, t, kwargs) for t in texts]
    tau = {name: _tau(pair, prompts, max_new_tokens, block) for name, prompts in formats.items()}
    best = max(tau, key=tau.get)
    checks = [Check(f"τ {name}", OK, f"{value:.2f} tokens per verify step over {len(texts)} prompts") for name, value
              in tau.items()]
    if use != "auto":
        mine = max((v for k, v in tau.items() if k.startswith(use)), default=0.0)
        if mine < 0.8 * tau[best]:
            checks.append(Check("prompt format", WARN, f"requests will use {use} prompts (τ {mine:.2f}), but the "
                                                        f"drafter fits {best} prompts better (τ {tau[best]:.2f})"))
    taps, layers = pair.draft.config.target_layer_ids, pair.target.config.dims.num_layers
    for shift, convention in ((-1, "hidden_states[i]"), (1, "hidden_states[i + 2]")):
        moved = tuple(i + shift for i in taps)
        if not all(0 <= i < layers for i in moved):
            continue
        pair.draft.config = replace(pair.draft.config, target_layer_ids=moved)
        tau[f"taps {shift:+d}"] = shifted = _tau(pair, formats[best], max_new_tokens, block)
        pair.draft.config = replace(pair.draft.config, target_layer_ids=taps)
        off = shifted > 1.2 * tau[best] and shifted - tau[best] > 0.3
        checks.append(Check(f"tap convention {shift:+d}", WARN if off else OK,
                            f"τ {shifted:.2f} with {convention} instead of hidden_states[i + 1] ({tau[best]:.2f}): "
                            + (f"the drafter looks trained one layer {'lower' if shift < 0 else 'higher'} (off by one): "
                               f"check its target_layer_ids {list(taps)}" if off else "the configured convention fits")))
    return checks, tau


def _chat_ids(tokenizer, text: str, kwargs: dict) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def verdict(checks: list[Check]) -> str:
    if any(c.status == FAIL for c in checks):
        return FAIL
    return WARN if any(c.status == WARN for c in checks) else OK
