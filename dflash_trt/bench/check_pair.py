"""`dflash-trt check-pair`, measured part: τ of the pair through the engine in the formats requests may use.

τ (tokens per verify step, full blocks) on sample prompts, raw and through the chat template (each
thinking mode the template has), and with the taps one layer lower or higher (`hidden_states[i]` or
`[i + 2]` instead of `[i + 1]`, an off-by-one other engines have shipped: vLLM #40727, SGLang #32204,
z-lab #156): a drafter trained for the other convention or the other prompt format shows it here, not in
production. The static checks are engine/pair_check.py's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dflash_trt.engine.pair_check import OK, WARN, Check


def _prompt_texts(path, tokenizer, limit: int) -> list[str]:
    from dflash_trt.checkpoint.json_fields import jsonl_records
    from dflash_trt.engine.golden import HELDOUT

    texts = []
    for _, record in jsonl_records(Path(path or HELDOUT)):
        text = record.get("text") if isinstance(record, dict) else None
        if text is None and isinstance(record, dict) and "token_ids" in record:
            text = tokenizer.decode(record["token_ids"])
        if text:
            texts.append(text)
    return texts[:limit]


def _tau(pair, prompts: list[list[int]], max_new_tokens: int, block_size: int) -> float:
    """τ through the engine with full blocks (the drafter's acceptance, not a width policy's)."""
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.runtime.local import local_engine

    requests = [Request(tuple(p), stop=StopCriteria(max_new_tokens)) for p in prompts if p]
    engine = local_engine(pair, max(len(r.prompt) for r in requests) + max_new_tokens, block_size,
                          width_policy="schedule", max_batch_size=len(requests))
    results = engine.generate(requests)
    steps = [n for r in results for n in r.acceptance_lengths]
    return sum(steps) / len(steps) if steps else 0.0


def measured_checks(target_dir, draft_dir, prompts_path=None, num_prompts: int = 8, max_new_tokens: int = 64,
                    device: str = "cpu", use: str = "auto") -> tuple[list[Check], dict[str, float]]:
    """τ raw / chat-templated (each thinking mode) / with taps one layer lower; `use` (raw | chat | auto):
    the format requests will use, warned about when another format fits the drafter clearly better."""
    from dflash_trt.model.loader import load_pair

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
