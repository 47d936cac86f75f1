"""The model cards (README.md) of the shipped tiny pair, written by scripts/make_tiny_pair.py from its
make_log.json: data, sizes, steps, every drafter run and the measured acceptance."""

from __future__ import annotations

import json
from pathlib import Path


def write_cards(work: Path, log: dict, shape: dict) -> None:
    """Model cards (README.md) for both folders: data, sizes, steps, measured acceptance; `shape` is
    the target's architecture (make_tiny_pair.shape)."""
    m, t, d, data = log["measured"], log["target"], log["draft"], log["data"]
    record = json.loads((work / "draft" / "dflash_trt_draft_vocab.json").read_text())
    vocab = {"n": len(record["token_ids"]), "recommended": record["recommended_size"], "source": record["source"]}
    table = "\n".join(
        f"| {b.split('_')[1]} | {v.get('confidence', 0.0) or 'full blocks'} | {v['mean_acceptance_length']:.2f} | "
        f"{v['spec_tokens_per_s']:.1f} | {v['ar_tokens_per_s']:.1f} | {v['speedup']:.2f}x | {v['identical']} |"
        for b, v in m.items())
    measured = ("| block size | draft confidence | τ | DFlash tok/s | AR tok/s | speed-up | identical |\n"
                "|---|---|---|---|---|---|---|\n"
                + table + f"\n\nGreedy, batch 1, fp32, one CPU thread{machine(log)}, on 32 held-out prompts x 128 new tokens "
                "(`dflash_trt/assets/heldout_prompts.jsonl`); `dflash-trt bench` reproduces it.")
    measured += sampled_table(log.get("measured_sampled")) + lengths_table(log.get("measured_lengths"))
    source = (f"Python {Path(data['stdlib']).name.removeprefix('python')} standard library sources ({data['train_files']} training files, "
              f"{data.get('train_tokens', '?')} tokens; {data['heldout_files']} files held out by path hash)")
    reproduce = "`python scripts/make_tiny_pair.py --stage all --seed 0`"
    upscaled = ""
    if t.get("init"):
        first = log.get("target_init") or {}
        made = (f" ({first['steps']} steps from scratch, {first['seconds']} s, final loss {first['final_loss']:.2f})"
                if {"steps", "seconds", "final_loss"} <= first.keys() else "")
        upscaled = (f", starting from a trained {t.get('init_layers', '?')}-layer target{made} whose layers were "
                    f"repeated (depth up-scaling, `--target-init`); both runs are in `make_log.json`")
        reproduce = f"`{t.get('command', 'python scripts/make_tiny_pair.py --target-init DIR ...')}` (see make_log.json)"
    (work / "target" / "README.md").write_text(f"""# tiny-qwen3 (dflash-trt's embedded default target)

A Qwen3-architecture causal LM trained from scratch for dflash-trt's tests, quickstart and benchmarks.

- architecture: Qwen3ForCausalLM, {t.get('layers', shape['num_hidden_layers'])} layers, hidden {shape['hidden_size']},
  {shape['num_attention_heads']} heads / {shape['num_key_value_heads']} KV heads, head_dim {shape['head_dim']},
  MLP {shape['intermediate_size']}, tied embeddings, vocab 4096; {t['params'] / 1e6:.2f} M parameters, stored in bf16
- tokenizer: byte-level BPE (vocab 4096) trained on the same data; `<|endoftext|>` = 0 (EOS), `<|mask|>` = 1
  (DFlash mask token); no chat template (it is a code model)
- data: {source}
- training: {t['steps']} steps x {t['batch']} x {t['seq_len']} tokens, AdamW (lr {t.get('lr', 3e-3):g}, cosine), final loss {t['final_loss']:.2f},
  {t['seconds']} s on the 2-core CPU dev machine{upscaled}
- reproduce: {reproduce}{positions(log.get("yarn"))}

Not a useful language model: a small, fast, real target whose greedy continuations a drafter can learn.
""")
    continued, history = "", log.get("draft_history", []) if d.get("init") else []
    if history:
        made = "; ".join(f"{r.get('layers', '?')} layer(s), {r['steps']} steps, lr {r.get('lr', '?')}, "
                         f"{r.get('samples', '?')} samples, {r['seconds']:.0f} s"
                         for r in history if {"steps", "seconds"} <= r.keys())
        grew = (f", grown to {d['layers']} layers (new layers start as the identity)"
                if history[-1].get("layers") and history[-1]["layers"] != d.get("layers") else "")
        continued = (f" (lr {d.get('lr', '?')}), continuing earlier runs ({made}){grew} "
                     f"(`--draft-init`; every run in make_log.json)")
    runs = [r.get("command") for r in [*history, d] if r.get("command")]
    reproduce_draft = ", then (the previous run's `draft/` moved to the `--draft-init` path) ".join(f"`{c}`" for c in runs)
    reproduce_draft = reproduce_draft or "`python scripts/make_tiny_pair.py --stage all --seed 0`"
    (work / "draft" / "README.md").write_text(f"""# tiny-qwen3-dflash (dflash-trt's embedded default drafter)

A DFlash drafter (z-lab format: `DFlashDraftModel`, `dflash_config`) for tiny-qwen3, trained with
`dflash-trt train-draft --regenerate`; it loads in dflash-trt and in z-lab's `dflash==0.1.0`.

- {d.get('layers', '?')} draft layer(s), block_size 16, target_layer_ids and mask_token_id in config.json{window(d)}
- prompt format: trained on raw prompts (no chat template; the target has no thinking mode); `dflash-trt
  check-pair` measures τ raw and chat-templated
- data: {d.get('samples', '?')} prompts of 64 tokens cut from the training files{stride(d)}, continued by the target
  {continuation(d)} (192 new tokens each); the prompts are one seeded stream, so a run on more samples starts with
  an earlier run's{long_data(d)}
- training: {d['steps']} steps, final loss {d['final_loss']:.3f}, {d['seconds']:.0f} s{continued}{objective(d)}; settings
  in `dflash_trt_train.json`
- reproduce: {reproduce_draft}
- draft vocabulary: `dflash_trt_draft_vocab.json` ranks the {vocab['n']} distinct tokens of {vocab['source']}
  (what the target emits, whichever run's data counted them); the recommended {vocab['recommended']} cover 99.9% of them (`runtime.draft_vocab_size`, `--draft-vocab auto`; lossless)

## Measured acceptance

{measured}
""")


def continuation(run: dict) -> str:
    """How a drafter run's data was continued: 'greedily', or the temperatures sample i cycles through."""
    temps = run.get("regen_temperature") or 0.0
    temps = temps if isinstance(temps, list) else [temps]
    if all(t == 0 for t in temps):
        return "greedily"
    return "at temperatures " + " / ".join(f"{t:g}" for t in temps) + " in turn (0 = greedy)"


def objective(run: dict) -> str:
    if not run.get("distill_temperature"):
        return ""
    w, slots = run.get("distill_weight", 1.0), run.get("distill_slots")
    where = f" at block slot{'s 1..' if slots and slots > 1 else ' '}{slots}" if slots else ""
    return (f"; loss {w:g} x KL to the target's distribution at T {run['distill_temperature']:g}{where} + {1 - w:g} x "
            f"the hard-label CE (`--distill-temperature`, `--distill-weight`"
            f"{', `--distill-slots`' if slots else ''})")


def markdown_table(intro: str, header: list[str], rows: list[list[str]], outro: str) -> str:
    """A card's measured table: an introducing line, the table, the command that reproduces it."""
    lines = "\n".join("| " + " | ".join(row) + " |" for row in rows)
    return f"\n\n{intro}:\n\n| {' | '.join(header)} |\n|{'---|' * len(header)}\n{lines}\n\n{outro}"


def sampled_table(rows: list[dict] | None) -> str:
    """τ (full blocks of 16) and speed-up (`auto` widths, the confidence cut) per temperature."""
    if not rows:
        return ""
    return markdown_table(
        "By temperature (block 16, batch 1, the same prompts, seed 0; sampled requests get coupled drafts)",
        ["temperature", "τ, full blocks", "first draft accepted", "speed-up, CPU defaults (`auto`, cut 0.1)",
         "identical"],
        [[f"{r['temperature']:g}", f"{r['tau_full_blocks']:.2f}", f"{r['first_draft_accepted']:.2f}",
          f"{r['speedup_auto']:.2f}x", str(r["identical"])] for r in rows],
        "`dflash-trt bench --block-sizes 16 --num-prompts 32 --temperature 0,0.7,1.0,1.5 --width-policy schedule "
        "--draft-confidence 0` gives the τ column, the same without the last two options the speed-up.")


def stride(run: dict) -> str:
    n = run.get("prompt_stride", 1)
    return f" (prompts 0, {n}, {2 * n}, ... of the stream)" if n > 1 else ""


def machine(log: dict) -> str:
    """' (on <cpu>, <date>)' when make_log.json records where the measure stage ran."""
    m = log.get("measured_on")
    return f" (on {m['cpu']}, {m['date']})" if m else ""


def positions(yarn: dict | None) -> str:
    """The target's long-context extension: YaRN over its trained window, and the loss by position it gives."""
    if not yarn:
        return ""
    before, after = yarn["loss_by_position"]["rope"], yarn["loss_by_position"]["yarn"]
    return (f"\n- positions: {yarn['max_position_embeddings']:,} by YaRN (`rope_parameters`: factor "
            f"{yarn['factor']:g} over the {yarn['original_max_position_embeddings']:,} it was built with, transformers' default attention "
            f"factor and ramp; `{yarn['command']}`), no long-context training. Next-token loss on {after['files']} "
            f"held-out files of {after['tokens']:,}+ tokens, by position:\n\n"
            f"  | rope | {' | '.join(after['bins'])} |\n  |---|{'---|' * len(after['bins'])}\n"
            f"  | plain (before) | {' | '.join(f'{v:.2f}' for v in before['loss'])} |\n"
            f"  | yarn (shipped) | {' | '.join(f'{v:.2f}' for v in after['loss'])} |\n\n"
            "  (later bins hold later parts of long files: compare the rows, not the bins)")


def long_data(run: dict) -> str:
    """The long-data stage's samples a drafter run trained on beside the short ones, if any."""
    long = run.get("long_data")
    if not long:
        return ""
    from tiny_pair_long import LENGTHS

    counts = ", ".join(f"{n} x {length:,}" for length, n in LENGTHS.items())
    return (f"; and {long['samples']} prompts of 512 to 8,000 tokens cut from the same files ({counts}), continued by "
            f"the target greedily ({long['new_tokens']} new tokens each; `--stage long-data`), trained as they are: "
            f"the target reads the whole prompt, the drafter's row ({run.get('seq_len', 512)} tokens) starts "
            f"{long['window']} positions before the continuation (train-draft's `drafter_from`), so it learns the "
            f"target's hidden states after long prefixes")


def window(run: dict) -> str:
    w = run.get("sliding_window")
    return (f"; context attention windowed to {w} positions (`layer_types` sliding_attention, `is_causal` false:"
            " a draft pass costs the same at any context length, and every distance it sees is one it trained at)"
            if w else "")


def lengths_table(rows: list[dict] | None) -> str:
    """τ and speed-up by context length (the CPU defaults)."""
    if not rows:
        return ""
    return markdown_table(
        "By context length (greedy, block 16, the CPU defaults; 4 prompts cut from "
        "`dflash_trt/assets/heldout_long.jsonl` x 64 new tokens; end to end includes the prompt's prefill)",
        ["context", "τ", "speed-up, end to end", "decode only", "identical"],
        [[f"{r['context']:,}", f"{r['tau']:.2f}", f"{r['speedup']:.2f}x", f"{r['decode_speedup']:.2f}x",
          str(r["identical"])] for r in rows],
        "`dflash-trt bench --prompts dflash_trt/assets/heldout_long.jsonl --context-lengths 512,2048,8192 "
        "--num-prompts 4 --max-new-tokens 64` reproduces it.")
