"""The measure stage of scripts/make_tiny_pair.py: τ and speed-ups of a --work pair (greedy, by
temperature, by context length), the held-out loss by position, and the machine it ran on."""

from __future__ import annotations

from pathlib import Path

import torch


def read(path: Path) -> str:
    """A source file's text (the data of every stage; undecodable bytes replaced)."""
    return path.read_text(encoding="utf-8", errors="replace")


POSITION_BINS = (0, 256, 512, 1024, 2048, 4096, 8192)


def loss_by_position(target: Path, files: list[Path], tokens: int = 8192, docs: int = 8) -> dict:
    """Mean next-token loss (transformers, fp32) of the first `docs` files with at least `tokens` tokens, per
    position bin of POSITION_BINS: how the target reads far into a long file."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    rows = [ids[:tokens] for ids in (tok.encode(read(p), add_special_tokens=False).ids for p in files)
            if len(ids) >= tokens][:docs]
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        losses = torch.stack([torch.nn.functional.cross_entropy(model(torch.tensor([r])).logits[0, :-1],
                                                                torch.tensor(r[1:]), reduction="none") for r in rows])
    mean = losses.mean(0)
    bins = [(a, b) for a, b in zip(POSITION_BINS, POSITION_BINS[1:]) if a < tokens - 1]
    return {"files": len(rows), "tokens": tokens, "bins": [f"{a}-{b}" for a, b in bins],
            "loss": [round(float(mean[a : b - 1].mean()), 3) for a, b in bins]}


def _bench_setup(work: Path, prompts: int, draft_vocab: str | None):
    """The --work pair (fp32, CPU; `draft_vocab` as `--draft-vocab`), its first `prompts` held-out prompts and
    stop ids (bench_block_size warms both decoders itself)."""
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.model.loader import apply_draft_vocab, load_pair
    from dflash_trt.tokenizer import stop_token_ids

    pair = apply_draft_vocab(load_pair(work / "target", work / "draft", "fp32", "cpu"), draft_vocab)
    held = load_prompts(work / "heldout_prompts.jsonl", pair.tokenizer, prompts)
    return pair, held, stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids)


def measure(work: Path, prompts: int = 32, new_tokens: int = 128) -> dict:
    """τ at block 8 and 16 and the DFlash / AR speed ratio on held-out prompts (greedy, batch 1)."""
    from dflash_trt.bench.local import bench_block_size
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.runtime.local import default_draft_confidence

    pair, held, stops = _bench_setup(work, prompts, draft_vocab=None)
    out = {}
    cut = default_draft_confidence("cpu")
    for confidence in (0.0, cut):  # full blocks (the τ the drafter reaches), then the CPU default
        for block in (8, 16):
            r = bench_block_size(pair, held, block, new_tokens, SamplingParams(), stops, min_confidence=confidence,
                                 width_policy="schedule")
            key = f"block_{block}" + (f"_confidence_{confidence}" if confidence else "")
            out[key] = {k: v for k, v in r.to_dict().items() if k != "acceptance_histogram"} | {"confidence": confidence}
            print(f"block {block}, confidence {confidence}: tau {r.mean_acceptance_length:.2f}, DFlash "
                  f"{r.spec_tokens_per_s:.1f} tok/s, AR {r.ar_tokens_per_s:.1f} tok/s, speed-up {r.speedup:.2f}x, "
                  f"identical {r.identical}", flush=True)
    return out


def measure_lengths(work: Path, lengths=(512, 2048, 8192), prompts: int = 4, new_tokens: int = 64) -> list[dict]:
    """τ and the speed-up by context length with the CPU defaults (draft vocabulary, confidence cut, `auto`
    widths), greedy, batch 1: the long held-out prompts cut to each length, as `dflash-trt bench
    --prompts dflash_trt/assets/heldout_long.jsonl --context-lengths 512,2048,8192 --num-prompts 4
    --max-new-tokens 64`."""
    from dflash_trt.bench.local import bench_block_size, context_prompts, load_prompts
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.runtime.local import default_draft_confidence

    pair, _, stops = _bench_setup(work, 1, draft_vocab="auto")
    stream = load_prompts(work / "heldout_long.jsonl", pair.tokenizer, None)
    rows = []
    for length in lengths:
        r = bench_block_size(pair, context_prompts(stream, length, prompts), 16, new_tokens, SamplingParams(), stops,
                             min_confidence=default_draft_confidence("cpu"), width_policy="auto")
        rows.append({"context": length, "tau": r.mean_acceptance_length, "speedup": r.speedup,
                     "decode_speedup": r.decode_speedup, "identical": r.identical})
        print(f"context {length}: tau {r.mean_acceptance_length:.2f}, speed-up {r.speedup:.2f}x "
              f"(decode only {r.decode_speedup:.2f}x), identical {r.identical}", flush=True)
    return rows


def cpu_name() -> str:
    """'Intel(R) Xeon(R) Processor, 2 cores, L3 480 MiB' from /proc/cpuinfo and sysfs (what the speed-ups depend on)."""
    import os

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")
    l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    return f"{name}, {os.cpu_count()} cores" + (f", L3 {l3.read_text().strip()}" if l3.is_file() else "")


def measure_sampled(work: Path, prompts: int = 32, new_tokens: int = 128, temperatures=(0.0, 0.7, 1.0, 1.5),
                    seed: int = 0) -> list[dict]:
    """τ with full blocks of 16 and the speed-up with the CPU defaults (`auto` widths, the confidence cut) at each
    temperature, batch 1, the same prompts and seed as `dflash-trt bench --temperature 0,0.7,1.0,1.5`."""
    from dflash_trt.bench.local import bench_block_size
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.runtime.local import default_draft_confidence

    pair, held, stops = _bench_setup(work, prompts, draft_vocab="auto")  # as bench does
    rows = []
    for t in temperatures:
        params = SamplingParams(t, seed=seed)
        full = bench_block_size(pair, held, 16, new_tokens, params, stops, width_policy="schedule")
        served = bench_block_size(pair, held, 16, new_tokens, params, stops,
                                  min_confidence=default_draft_confidence("cpu"), width_policy="auto")
        rows.append({"temperature": t, "tau_full_blocks": full.mean_acceptance_length,
                     "first_draft_accepted": full.per_position_acceptance[0], "speedup_auto": served.speedup,
                     "identical": full.identical and served.identical})
        print(f"T {t}: tau {full.mean_acceptance_length:.2f} (full blocks), speed-up {served.speedup:.2f}x (auto), "
              f"identical {rows[-1]['identical']}", flush=True)
    return rows
