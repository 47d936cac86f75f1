#!/usr/bin/env python
"""Write the shipped agent workload (dflash_trt/assets/agent_trace.jsonl) for `dflash-trt bench --trace builtin:agents`.

Three agents, each with its own system prompt of ~512 tokens (eight held-out prompts of the shipped pair's data,
Python from the standard library), work on one task (a held-out prompt) per session in a pipeline:
1. planner: its system prompt and the task;
2. coder: its system prompt, the task and the planner's answer;
3. coder again: the whole conversation so far and a short revision note (a turn almost wholly cached);
4. reviewer: its system prompt, the task and the coder's last answer.
Every agent's system prompt is shared by all sessions, so after the first session each agent's turns start with
a cached prefix; the third turn extends the second's whole context. Deterministic: the held-out prompts only.

    python scripts/make_agent_trace.py [--sessions 8] [--out dflash_trt/assets/agent_trace.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "dflash_trt" / "assets" / "heldout_prompts.jsonl"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "dflash_trt" / "assets" / "agent_trace.jsonl")
    args = parser.parse_args(argv)
    texts = [json.loads(line)["text"] for line in HELDOUT.read_text().splitlines() if line.strip()]
    planner, coder, reviewer = ("".join(texts[i : i + 8]) for i in (0, 8, 16))
    lines = []
    for s in range(args.sessions):
        task, note = texts[24 + s], texts[40 + s][: len(texts[40 + s]) // 2]
        turns = [
            {"fresh": True, "max_tokens": 64,
             "messages": [{"role": "system", "content": planner}, {"role": "user", "content": task}]},
            {"fresh": True, "max_tokens": 64, "think_s": 0.05,
             "messages": [{"role": "system", "content": coder}, {"role": "user", "content": task},
                          {"role": "user", "content": "{previous}"}]},
            {"max_tokens": 64, "think_s": 0.05, "messages": [{"role": "user", "content": note}]},
            {"fresh": True, "max_tokens": 64, "think_s": 0.05,
             "messages": [{"role": "system", "content": reviewer}, {"role": "user", "content": task},
                          {"role": "user", "content": "{previous}"}]},
        ]
        lines.append(json.dumps({"session": f"task-{s}", "turns": turns}))
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {args.sessions} sessions of {len(turns)} turns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
