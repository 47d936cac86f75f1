"""`dflash-trt train-draft`: train a DFlash drafter for a Hugging Face target."""

from __future__ import annotations

import json

import click

from dflash_trt.cli.types import FLOAT_LIST, INT_LIST, MODEL_DIR


@click.command("train-draft", short_help="Train a DFlash drafter for a HF target (CPU or CUDA).")
@click.option("--target", type=MODEL_DIR, required=True, help="HF target folder.")
@click.option("--data", type=click.Path(exists=True, dir_okay=False), multiple=True, required=True,
              help="JSONL (token_ids | text | prompt+completion) or text files; repeatable.")
@click.option("--data-as-is", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Data used as it is, with --regenerate too (e.g. the target's continuations of long prompts: "
                   "token_ids records with trained_from and drafter_from, the drafter's row starting at "
                   "drafter_from, the target reading the tokens before it); repeatable.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Output drafter folder (z-lab format).")
@click.option("--block-size", type=click.IntRange(min=2), default=16, show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=1, show_default=True, help="Draft decoder layers.")
@click.option("--target-layer-ids", type=INT_LIST, help="Tapped target layers (default: up to 5, spread).")
@click.option("--mask-token-id", type=click.IntRange(min=0), help="Default: tokenizer mask token / first unused row.")
@click.option("--steps", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=4), default=256, show_default=True)
@click.option("--num-anchors", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=6e-4, show_default=True)
@click.option("--regenerate", is_flag=True, help="Continue each sample's prompt with the target itself.")
@click.option("--regen-prompt-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--regen-new-tokens", type=click.IntRange(min=1), default=192, show_default=True)
@click.option("--regen-temperature", "--regenerate-temperature", "regen_temperature", type=FLOAT_LIST,
              default="0", show_default=True,
              help="Regenerate by sampling at this temperature (0: greedy), e.g. the serving temperature; a list "
                   "(0,1.0) mixes them: sample i is continued at the (i mod n)-th temperature.")
@click.option("--distill-temperature", type=click.FloatRange(min=0, min_open=True),
              help="Add a KL loss to the target's distribution at this temperature (soft labels) to the hard-label "
                   "loss: a drafter for sampled serving (coupled drafts match when its distribution matches).")
@click.option("--distill-weight", type=click.FloatRange(min=0, max=1), default=1.0, show_default=True,
              help="With --distill-temperature: loss = w * KL + (1 - w) * hard-label CE.")
@click.option("--distill-slots", type=click.IntRange(min=1),
              help="With --distill-temperature: the KL on the first N block slots only (default: every slot). "
                   "1 distils the next-token distribution, which is the target's at every temperature, and "
                   "leaves the later slots to the hard labels.")
@click.option("--max-samples", type=click.IntRange(min=1), help="Use at most this many samples.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--save-every", type=click.IntRange(min=1), default=200, show_default=True,
              help="Steps between resumable checkpoints (OUT.train-state/).")
@click.option("--device", default="auto", show_default=True)
@click.option("--cache-features", is_flag=True,
              help="Keep the target's features of the data in the cache dir (samples x seq-len x taps x hidden x 4 "
                   "bytes) so later runs on the same target, taps and data skip computing them.")
@click.option("--feature-memory-gb", type=click.FloatRange(min=0), default=4.0, show_default=True,
              help="Compute the target's features of the whole dataset once and keep them in memory up to this "
                   "size (samples x seq-len x taps x hidden x 4 bytes); larger datasets run the target every step.")
@click.option("--eval-samples", type=click.IntRange(min=0), default=0, show_default=True,
              help="Hold out this many samples for the reported τ (0: measure it on 16 training samples).")
@click.option("--sliding-window", type=click.IntRange(min=2),
              help="Window the drafter's context attention to this many positions (every layer z-lab's "
                   "sliding_attention, not causal): a draft pass then costs the same at any context length. "
                   "Default: full attention.")
@click.option("--init", type=MODEL_DIR,
              help="Start from this drafter's weights (same taps and block size; a shallower one grows "
                   "deeper): train longer, fine-tune or deepen.")
def train_draft_command(**options):
    """Train a drafter: frozen target taps + random anchor blocks, decayed cross-entropy.

    Interrupted runs resume from OUT.train-state/ when started again with the same settings.
    """
    from dflash_trt.train.trainer import TrainDraftConfig, train_draft

    options["data"], options["data_as_is"] = list(options["data"]), list(options["data_as_is"])
    options["regen_temperature"] = list(options["regen_temperature"])  # TrainDraftConfig records one as a number
    summary = train_draft(TrainDraftConfig(**options))
    click.echo(json.dumps(summary | {"out": options["out"]}, indent=2))


@click.command("draft-vocab", short_help="Write a drafter's draft vocabulary (the tokens its head scores).")
@click.option("--target", type=MODEL_DIR, required=True,
              help="HF target folder (tokenizer for text data, vocabulary size, regeneration).")
@click.option("--draft", type=MODEL_DIR, required=True,
              help="Drafter folder: dflash_trt_draft_vocab.json is written (replaced) there.")
@click.option("--data", type=click.Path(exists=True, dir_okay=False), multiple=True, required=True,
              help="JSONL (token_ids | text | prompt+completion) or text files; repeatable.")
@click.option("--regenerate", is_flag=True, help="Count the target's own continuations of each sample's prompt "
              "(what the drafter will be asked to propose), not the data's tokens.")
@click.option("--regen-prompt-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--regen-new-tokens", type=click.IntRange(min=1), default=192, show_default=True)
@click.option("--max-samples", type=click.IntRange(min=1), help="Use at most this many samples.")
@click.option("--coverage", type=click.FloatRange(min=0, max=1, min_open=True), default=0.999, show_default=True,
              help="The recommended size covers this share of the counted tokens.")
@click.option("--device", default="auto", show_default=True)
def draft_vocab_command(target, draft, data, regenerate, regen_prompt_tokens, regen_new_tokens, max_samples,
                        coverage, device):
    """Rank the tokens of DATA by frequency for the drafter in DRAFT (runtime.draft_vocab_size).

    The drafter then scores only the most frequent tokens when proposing: fewer head weights read
    per step, same output (verification always scores the full vocabulary).
    """
    from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
    from dflash_trt.model import draft_vocab
    from dflash_trt.model.loader import load_pair
    from dflash_trt.train.data import vocab_from_data

    check_pair(read_target(target), read_draft(draft))  # a drafter of this target, before any work
    pair = load_pair(target, None, dtype="fp32", device=device)
    regen = (regen_prompt_tokens, regen_new_tokens) if regenerate else None
    record = vocab_from_data(pair, list(data), regen, max_samples, coverage)
    path = draft_vocab.write_vocab_file(draft, record)
    click.echo(f"wrote {path}: {len(record['token_ids'])} distinct tokens of {record['vocab_size']}; "
               f"recommended_size {record['recommended_size']} covers {coverage:.1%} of {sum(record['counts'])} tokens")
