#!/usr/bin/env python
"""The τ a block-parallel drafter could reach at T > 0 on a target, at best: what distillation aims at.

A DFlash drafter proposes every slot of a block in one pass, so the token it drafts at slot k cannot
depend on the tokens the target samples at slots 1..k-1. With coupled drafts (the request's own Gumbel
noise, `d_k = argmax_v log q_k[v] + g_k[v]`) the best such drafter is one whose q_k is the target's
MARGINAL at slot k over its sampled paths — what KL training on sampled data converges to. This script
measures that drafter on real contexts, with HF `transformers` as the target (fp32):

  1. contexts: held-out prompts continued by the target at T (sampled), cut at a few points;
  2. the marginal m_k (k = 1..K) of each context from `--paths` sampled paths, Rao-Blackwellised
     (the mean of the paths' softmax rows, not of their one-hot tokens);
  3. `--noises` fresh noise draws: the target's own chain t_k = argmax(log p(.|t_<k)/T + g_k) and the
     ideal drafter's d_k = argmax(log m_k + g_k); τ = 1 + the leading matches (slot 1 always matches:
     m_1 is the target's own distribution).

    python scripts/sampled_ceiling.py --temperatures 0.7,1.0,1.5 --prompts 24

A finite number of paths makes m_k noisy, so the figure is a slight underestimate; `--paths` tells how
much (the table prints it). Compare the drafter's measured τ (`dflash-trt bench --temperature ...
--width-policy fixed --draft-confidence 0`).
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "dflash_trt" / "assets"


def gumbel(shape, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0)
    return -torch.log(-torch.log(u))


@torch.no_grad()
def continue_sampled(model, ids: list[int], n: int, t: float, g: torch.Generator) -> list[int]:
    """`ids` continued by `n` tokens sampled from the target at temperature `t` (Gumbel-max)."""
    out = model(torch.tensor([ids]), use_cache=True)
    cache, logits, new = out.cache, out.logits[0, -1], []
    for _ in range(n):
        token = int(torch.argmax(torch.log_softmax(logits.double() / t, -1) + gumbel(logits.shape, g)))
        new.append(token)
        out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache, logits = out.cache, out.logits[0, -1]
    return new


@torch.no_grad()
def chains(model, cache, logits: torch.Tensor, depth: int, t: float, noise: torch.Tensor):
    """Rows continued by Gumbel-max with the given noise [R, depth, V] from a shared prefix (`cache`,
    `logits` [V] after it). -> (tokens [R, depth], log-probabilities at T [R, depth, V])."""
    rows = noise.shape[0]
    cache = copy.deepcopy(cache)
    cache.batch_repeat_interleave(rows)
    logp = torch.log_softmax(logits.double() / t, -1).expand(rows, -1)
    tokens, logps = [], []
    for k in range(depth):
        token = torch.argmax(logp + noise[:, k], -1)
        tokens.append(token)
        logps.append(logp)
        if k + 1 < depth:
            out = model(token[:, None], cache=cache, use_cache=True)
            cache, logp = out.cache, torch.log_softmax(out.logits[:, -1].double() / t, -1)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


@torch.no_grad()
def ceiling_at(model, context: list[int], depth: int, t: float, paths: int, noises: int, g: torch.Generator):
    """Leading matches of the ideal parallel drafter against the target's chain, per noise draw [noises]."""
    out = model(torch.tensor([context]), use_cache=True)
    cache, logits = out.cache, out.logits[0, -1]
    vocab = logits.shape[-1]
    _, path_logp = chains(model, cache, logits, depth, t, gumbel((paths, depth, vocab), g))
    marginal = path_logp.exp().mean(0).log()  # [depth, V]
    noise = gumbel((noises, depth, vocab), g)
    target, _ = chains(model, cache, logits, depth, t, noise)
    drafts = torch.argmax(marginal[None] + noise, -1)  # [noises, depth]
    return (drafts == target).long().cumprod(1).sum(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=ASSETS / "tiny-qwen3")
    ap.add_argument("--prompts-file", type=Path, default=ASSETS / "heldout_prompts.jsonl")
    ap.add_argument("--temperatures", default="0.7,1.0,1.5")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--cuts", default="8,40,72", help="context ends, in tokens after the prompt")
    ap.add_argument("--depth", type=int, default=15, help="drafts per block (block_size - 1)")
    ap.add_argument("--paths", type=int, default=64, help="sampled paths per context for the marginal")
    ap.add_argument("--noises", type=int, default=32, help="noise draws (decoding steps) per context")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    prompts = [json.loads(line)["token_ids"] for line in args.prompts_file.read_text().splitlines()][: args.prompts]
    cuts = [int(c) for c in args.cuts.split(",")]
    results = []
    for t in (float(x) for x in args.temperatures.split(",")):
        g = torch.Generator().manual_seed(args.seed)
        matches = []
        for prompt in track(prompts, description=f"T {t}"):
            text = prompt + continue_sampled(model, prompt, max(cuts), t, g)
            for cut in cuts:
                matches.append(ceiling_at(model, text[: len(prompt) + cut], args.depth, t, args.paths, args.noises, g))
        m = torch.cat(matches).double()
        results.append({"temperature": t, "tau": 1 + float(m.mean()), "contexts": len(matches),
                        "accept": [float((m >= i).double().mean()) for i in range(1, 6)]})
    table = Table(title=f"ideal parallel drafter (marginals from {args.paths} paths), block {args.depth + 1}")
    for col in ("T", "τ ceiling", "P(first 1..5 drafts accepted)", "contexts"):
        table.add_column(col)
    for r in results:
        table.add_row(f"{r['temperature']}", f"{r['tau']:.2f}", " / ".join(f"{a:.2f}" for a in r["accept"]),
                      f"{r['contexts']} x {args.noises}")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
