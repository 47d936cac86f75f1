#!/usr/bin/env python
"""Reproduce the shipped tiny pair from a seed: tokenizer -> target -> regenerated data -> drafter.

Data: the Python standard library sources of the running interpreter (every machine has them
offline), split into train / held-out files by a hash of the relative path. Stages (each reuses
the previous stage's output in --work):

  tokenizer  byte-level BPE (vocab 4096, `<|endoftext|>` = 0, `<|mask|>` = 1) on the train files
  target     Qwen3 architecture (--target-layers, default 6; hidden 192) trained from scratch (or grown from a
             trained shallower one, --target-init), saved as a HF folder
  draft      `dflash-trt train-draft --regenerate` on prompts cut from the train files
  prompts    held-out prompts (JSONL) for benchmarks
  measure    τ and speed-up on the held-out prompts; model cards
  install    copy --work's pair, prompts and log into dflash_trt/assets/
  all        tokenizer .. measure, then install

    python scripts/make_tiny_pair.py --stage all --seed 0

A deeper target can be grown from a trained shallower one (depth up-scaling, --target-init), and a
drafter trained further from a finished one (--draft-init). The shipped pair (24-layer target: its fp32
weights live in DRAM, as a real LLM's do, so verify rows ride along with one weight stream) came from:

    python scripts/make_tiny_pair.py --work out/tiny_pair_v4 --stage tokenizer
    python scripts/make_tiny_pair.py --work out/tiny_pair_v4 --stage target --target-layers 12 --target-steps 800
    python scripts/make_tiny_pair.py --work out/tiny_pair_v6 --stage target --target-layers 24 --target-steps 400 \
        --target-init out/tiny_pair_v4/target --target-lr 1.5e-3
    python scripts/make_tiny_pair.py --work out/tiny_pair_v6 --stage draft --draft-layers 2 --draft-samples 6144 \
        --draft-steps 3000 --threads 2
    # move out/tiny_pair_v6/draft to draft_s3000 (keep draft.train-state/samples.jsonl: the regenerated data)
    python scripts/make_tiny_pair.py --work out/tiny_pair_v6 --stage draft --draft-layers 2 --draft-samples 6144 \
        --draft-steps 2500 --draft-init out/tiny_pair_v6/draft_s3000 --draft-lr 1e-3 --threads 2
    # likewise, draft/ moved to draft_c2500
    python scripts/make_tiny_pair.py --work out/tiny_pair_v6 --stage draft --draft-layers 2 --draft-samples 6144 \
        --draft-steps 2000 --draft-init out/tiny_pair_v6/draft_c2500 --draft-lr 5e-4 --threads 2
    # likewise, draft/ moved to draft_c2000; then a fresh --work (target/ copied) and twice the data: the
    # prompt stream is seeded, so its first 6144 samples are the ones above (their regenerated samples.jsonl,
    # extended, can seed out/tiny_pair_v7/draft.train-state/ to save ~20 min)
    python scripts/make_tiny_pair.py --work out/tiny_pair_v7 --stage draft --draft-layers 2 --draft-samples 12288 \
        --draft-steps 2500 --draft-init out/tiny_pair_v6/draft_c2000 --draft-lr 5e-4 --threads 2
    python scripts/make_tiny_pair.py --work out/tiny_pair_v7 --stage prompts   # then measure, install

Time on the 2-core CPU dev machine: ~1 h (12-layer target) + ~51 min (24-layer) + ~84, ~63, ~51 and ~79 min
(the drafter's four runs, regeneration and target features included; regenerating 6144 samples takes
~21 min, the 24-layer target's features ~15 min per 6144); each stage's seconds are in make_log.json,
the runs' settings and results in the model cards.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its model-card writer, beside it
from tiny_pair_cards import write_cards  # noqa: E402
from tiny_pair_long import long_samples  # noqa: E402
from tiny_pair_measure import cpu_name, loss_by_position, measure, measure_lengths, measure_sampled, read  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "dflash_trt" / "assets"
SPECIALS = ["<|endoftext|>", "<|mask|>"]
TARGET_SHAPE = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=48)


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """(train, held-out) .py files of the stdlib, tests and site-packages excluded, sorted."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idle_test", "lib2to3", "__pycache__")
    files = sorted(p for p in lib.rglob("*.py") if not set(p.relative_to(lib).parts) & set(skip))
    held = lambda p: hashlib.sha256(str(p.relative_to(lib)).encode()).digest()[0] < 13  # ~5%  # noqa: E731
    return [p for p in files if not held(p)], [p for p in files if held(p)]


def train_tokenizer(work: Path, files: list[Path], vocab: int = 4096) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tok.train_from_iterator((read(p) for p in files), trainer)
    out = work / "target"
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIALS[0], "pad_token": SPECIALS[0],
        "mask_token": SPECIALS[1], "model_max_length": 1024, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")


def token_stream(work: Path, files: list[Path]) -> torch.Tensor:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(work / "target" / "tokenizer.json"))
    ids: list[int] = []
    for enc in tok.encode_batch([read(p) for p in files], add_special_tokens=False):
        ids += enc.ids + [0]
    return torch.tensor(ids, dtype=torch.int64)


def train_target(work: Path, stream: torch.Tensor, steps: int, seed: int, batch: int = 16, seq: int = 256,
                 layers: int = 6, init: Path | None = None, lr: float = 3e-3) -> dict:
    """Train the target from scratch, or from `init` (a trained shallower target: depth up-scaling)."""
    from rich.progress import Progress
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=4096, max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0,
                         eos_token_id=0, bos_token_id=None, pad_token_id=0, **(TARGET_SHAPE | {"num_hidden_layers": layers}))
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM(config)
    if init is not None:
        upscale_from(model, init)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    other = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    losses, t0, start = [], time.perf_counter(), 0
    ckpt = work / "target_ckpt.safetensors"
    if ckpt.is_file():  # resume: weights, AdamW moments, step and data generator state
        start = _load_target_ckpt(ckpt, model, opt, g)
    with Progress() as progress:
        task = progress.add_task("train target", total=steps, completed=start)
        for step in range(start, steps):
            starts = torch.randint(0, len(stream) - seq - 1, (batch,), generator=g)
            x = torch.stack([stream[s : s + seq] for s in starts])
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
            loss = model(x, labels=x).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            progress.update(task, advance=1, description=f"train target loss {sum(losses[-20:]) / len(losses[-20:]):.3f}")
            if (step + 1) % 25 == 0:
                print(f"step {step + 1}/{steps} loss {sum(losses[-25:]) / 25:.3f} "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
            if (step + 1) % 100 == 0:
                _save_target_ckpt(ckpt, model, opt, g, step + 1)
    model.to(torch.bfloat16).save_pretrained(work / "target")
    losses = losses or [float("nan")]
    return {"steps": steps, "batch": batch, "seq_len": seq, "layers": layers, "final_loss": sum(losses[-50:]) / 50,
            "lr": lr, "init": None if init is None else str(init),
            "init_layers": None if init is None else json.loads((init / "config.json").read_text())["num_hidden_layers"],
            "command": " ".join(["python", "scripts/make_tiny_pair.py", *sys.argv[1:]]),
            "seconds": round(time.perf_counter() - t0), "params": sum(p.numel() for p in model.parameters())}


def extend_with_yarn(work: Path, factor: float, held_files: list[Path]) -> dict:
    """The target reads `factor` times its positions: YaRN (transformers' `rope_type: yarn`, its default
    attention factor 0.1 ln(factor) + 1 and ramp) over its trained window, no further training. Distances
    within the old window keep their high-frequency rotations; the slow ones are interpolated. Records the
    held-out loss by position before and after."""
    path = work / "target" / "config.json"
    config = json.loads(path.read_text())
    if config.get("rope_parameters", {}).get("rope_type") == "yarn":
        raise SystemExit(f"{path}: the target already has yarn (run the stage once, on a trained target)")
    window = config["max_position_embeddings"]
    before = loss_by_position(work / "target", held_files)
    config["max_position_embeddings"] = int(window * factor)
    config["rope_parameters"] = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": window,
                                 "rope_theta": config["rope_parameters"]["rope_theta"]}
    path.write_text(json.dumps(config, indent=2) + "\n")
    tok_path = work / "target" / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    tok["model_max_length"] = config["max_position_embeddings"]
    tok_path.write_text(json.dumps(tok, indent=2) + "\n")
    return {"factor": factor, "original_max_position_embeddings": window,
            "max_position_embeddings": config["max_position_embeddings"],
            "loss_by_position": {"rope": before, "yarn": loss_by_position(work / "target", held_files)},
            "command": " ".join(["python", "scripts/make_tiny_pair.py", *sys.argv[1:]])}


def adopt_init(work: Path, init: Path, log: dict) -> None:
    """For --target-init: the init target's tokenizer (when --work has none) and, for the model card,
    how that target was made (its make_log.json one folder up, when there is one)."""
    out = work / "target"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (out / name).is_file():
            shutil.copy(init / name, out / name)
    parent_log = init.parent / "make_log.json"
    if parent_log.is_file():
        log["target_init"] = json.loads(parent_log.read_text()).get("target")


def upscale_from(model, init: Path) -> None:
    """Depth up-scaling: layer i of the deeper `model` starts as layer i * L_old // L_new of the trained
    target in `init` (HF folder, safetensors); embeddings and the final norm are copied."""
    from safetensors.torch import load_file

    old = load_file(str(init / "model.safetensors"))
    old_layers = json.loads((init / "config.json").read_text())["num_hidden_layers"]
    new_layers = model.config.num_hidden_layers
    state = {}
    for name, param in model.state_dict().items():
        src = name
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            src = f"model.layers.{int(i) * old_layers // new_layers}.{rest}"
        if src in old:
            if old[src].shape != param.shape:
                raise SystemExit(f"--target-init {init}: {src} has shape {tuple(old[src].shape)}, "
                                 f"the target's {name} needs {tuple(param.shape)}")
            state[name] = old[src].float()
    missing = model.load_state_dict(state, strict=False).missing_keys
    if [k for k in missing if "lm_head" not in k]:
        raise SystemExit(f"--target-init {init}: no weights for {missing}")


def _save_target_ckpt(path: Path, model, opt, g: torch.Generator, step: int) -> None:
    """Resumable target-training state as safetensors (weights, AdamW moments) + step and RNG."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items() if "lm_head" not in k}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    tensors[f"opt.{names[id(p)]}.{key}"] = state[key].contiguous()
    tensors["rng"] = g.get_state()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"step": str(step)})
    tmp.replace(path)


def _load_target_ckpt(path: Path, model, opt, g: torch.Generator) -> int:
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        step = int(f.metadata()["step"])
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    for name, p in model.named_parameters():
        if f"opt.{name}.exp_avg" in tensors:
            opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": tensors[f"opt.{name}.exp_avg"],
                            "exp_avg_sq": tensors[f"opt.{name}.exp_avg_sq"]}
    g.set_state(tensors["rng"])
    return step


# role-tagged turns, so chat clients (the OpenAI endpoint) work with the embedded default; the pair was trained on
# raw code, so chats are no better than their text
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def cut_prompts(work: Path, files: list[Path], n: int, length: int, seed: int, name: str) -> Path:
    """JSONL of `n` prompts of `length` tokens starting at random line starts of `files`."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(work / "target" / "tokenizer.json"))
    rng = random.Random(seed)
    out = []
    texts = [t for t in (read(p) for p in files) if len(t) > 2000]
    while len(out) < n:
        text = rng.choice(texts)
        lines = text.splitlines(keepends=True)
        start = rng.randrange(len(lines))
        ids = tok.encode("".join(lines[start : start + 40]), add_special_tokens=False).ids[:length]
        if len(ids) == length:
            out.append({"token_ids": ids, "text": tok.decode(ids)})
    path = work / name
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def long_prompts(work: Path, files: list[Path], piece: int = 512, tail: int = 256, lines: int = 128,
                 name: str = "heldout_long.jsonl") -> Path:
    """JSONL of the held-out files' tokens in file order, for prompts of any length up to the whole set
    (`bench --context-lengths` cuts them so that each ends where a line ends and reaches back over the lines
    before it): each file opens with `<|endoftext|>` (as the training stream joins files) and is cut into
    `piece`-token lines, its last `tail` tokens and any shorter remainder left out, so every line ends
    inside a file and a prompt ending there has the file's own text to continue. The first `lines` lines
    (65,536 tokens by default: eight spread prompts of 8,192)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(work / "target" / "tokenizer.json"))
    out = []
    for text in (read(p) for p in files):
        ids = [0] + tok.encode(text, add_special_tokens=False).ids
        for at in range(0, len(ids) - tail - piece + 1, piece):
            out.append({"token_ids": ids[at : at + piece]})
    path = work / name
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in out[:lines]))
    return path


def train_drafter(work: Path, seed: int, steps: int, layers: int, init: Path | None = None, lr: float = 1.5e-3,
                  regen_temperature: list[float] | None = None, distill_temperature: float | None = None,
                  distill_weight: float = 1.0, distill_slots: int | None = None, eval_samples: int = 0,
                  sliding_window: int | None = None, long_data: bool = False, seq_len: int = 256) -> dict:
    """`train-draft --regenerate` on the cut prompts; `regen_temperature` (a list mixes them, sample i taking
    the (i mod n)-th), `distill_*` and `eval_samples` as the command's options of those names; `long_data`:
    with the long-data stage's samples as they are (rows of `seq_len` tokens)."""
    from dflash_trt.train.trainer import TrainDraftConfig, train_draft

    depth = json.loads((work / "target" / "config.json").read_text())["num_hidden_layers"]
    taps = sorted({1, depth // 2, depth - 1})  # [1, 12, 23] for the 24-layer target
    prompts = work / "draft_prompts.jsonl"
    records = [json.loads(line) for line in prompts.read_text().splitlines()]
    (work / "draft_data.jsonl").write_text("".join(json.dumps({"token_ids": r["token_ids"]}) + "\n" for r in records))
    cfg = TrainDraftConfig(
        target=str(work / "target"), data=[str(work / "draft_data.jsonl")], out=str(work / "draft"),
        data_as_is=[str(work / "draft_long.jsonl")] if long_data else [],
        block_size=16, layers=layers, steps=steps, batch_size=8, seq_len=seq_len, num_anchors=32, lr=lr,
        target_layer_ids=taps,  # include the last layer (HF post-norm): shallow targets need deep taps
        regenerate=True, regen_prompt_tokens=64, regen_new_tokens=192, seed=seed, save_every=250,
        init=None if init is None else str(init),
        regen_temperature=list(regen_temperature or [0.0]),
        distill_temperature=distill_temperature, distill_weight=distill_weight, distill_slots=distill_slots,
        eval_samples=eval_samples, sliding_window=sliding_window,
        cache_features=True,  # the 24-layer target's features take ~15 min; a rerun or deeper drafter reuses them
        feature_memory_gb=12.0,  # 12288 samples x 256 x 3 taps x 192 x 4 bytes = 7.2 GB, held in memory (24 GB box)
    )
    return train_draft(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=["tokenizer", "target", "yarn", "long-data", "draft", "prompts", "measure",
                                        "install", "all"],
                    default="all")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "tiny_pair")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-steps", type=int, default=800)
    ap.add_argument("--draft-steps", type=int, default=4000)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--target-layers", type=int, default=6, help="decoder layers of the target (the shipped pair: 6)")
    ap.add_argument("--target-init", type=Path, default=None,
                    help="start the target from this trained shallower target (HF folder; layers repeated)")
    ap.add_argument("--target-lr", type=float, default=3e-3, help="peak learning rate of the target (cosine)")
    ap.add_argument("--draft-init", type=Path, default=None,
                    help="start the drafter from this trained drafter (train-draft --init); the run's out folder "
                         "and state are --work/draft*, so move a previous drafter elsewhere first")
    ap.add_argument("--draft-lr", type=float, default=1.5e-3, help="peak learning rate of the drafter (cosine)")
    ap.add_argument("--draft-samples", type=int, default=2048)
    ap.add_argument("--draft-regen-temperature", default="0",
                    help="regenerate the drafter's data at this temperature; a comma list mixes them (0,0.7,0,1.0)")
    ap.add_argument("--draft-distill-temperature", type=float, default=None,
                    help="add the KL to the target's distribution at this temperature (train-draft --distill-temperature)")
    ap.add_argument("--draft-distill-weight", type=float, default=1.0,
                    help="with --draft-distill-temperature: loss = w * KL + (1 - w) * CE")
    ap.add_argument("--draft-distill-slots", type=int, default=None,
                    help="with --draft-distill-temperature: the KL on the first N block slots only")
    ap.add_argument("--draft-prompt-stride", type=int, default=1,
                    help="train on every N-th prompt of the seeded prompt stream (2: prompts 0, 2, 4, ...)")
    ap.add_argument("--draft-eval-samples", type=int, default=0,
                    help="samples held out of training for the chain-simulated τ (train-draft --eval-samples)")
    ap.add_argument("--draft-sliding-window", type=int, default=None,
                    help="window the drafter's context attention (train-draft --sliding-window)")
    ap.add_argument("--draft-long-data", action="store_true",
                    help="stage draft: also train on --work's draft_long.jsonl (stage long-data) as it is")
    ap.add_argument("--draft-seq-len", type=int, default=256,
                    help="stage draft: tokens per training row (long data: its window + new tokens, 512)")
    ap.add_argument("--long-new-tokens", type=int, default=256,
                    help="stage long-data: tokens the target continues each long prompt with")
    ap.add_argument("--yarn-factor", type=float, default=16.0,
                    help="stage yarn: the target's positions times this, by YaRN over its current window")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is robust on a shared 2-core box)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    train_files, held_files = stdlib_files()
    log_path = args.work / "make_log.json"
    log = json.loads(log_path.read_text()) if log_path.is_file() else {}
    log["data"] = {"stdlib": Path(sysconfig.get_paths()["stdlib"]).name, "train_files": len(train_files), "heldout_files": len(held_files)}
    if args.stage == "install":  # copy a finished --work folder into dflash_trt/assets/
        install(args.work)
        return
    stages = ["tokenizer", "target", "yarn", "draft", "prompts", "measure"] if args.stage == "all" else [args.stage]
    for stage in stages:
        t0 = time.perf_counter()
        if stage == "tokenizer":
            train_tokenizer(args.work, train_files)
        elif stage == "target":
            if args.target_init is not None:
                adopt_init(args.work, args.target_init, log)
            stream = token_stream(args.work, train_files)
            log["data"]["train_tokens"] = len(stream)
            log["target"] = train_target(args.work, stream, args.target_steps, args.seed, layers=args.target_layers,
                                         init=args.target_init, lr=args.target_lr)
        elif stage == "draft":
            prompts = cut_prompts(args.work, train_files, args.draft_samples * args.draft_prompt_stride, 64, args.seed,
                                  "draft_prompts.jsonl")
            if args.draft_prompt_stride > 1:
                lines = prompts.read_text().splitlines()[:: args.draft_prompt_stride]
                prompts.write_text("".join(line + "\n" for line in lines))
            regen = [float(t) for t in args.draft_regen_temperature.split(",")]
            summary = train_drafter(args.work, args.seed, args.draft_steps, args.draft_layers, args.draft_init,
                                    args.draft_lr, regen, args.draft_distill_temperature, args.draft_distill_weight,
                                    args.draft_distill_slots, args.draft_eval_samples, args.draft_sliding_window,
                                    args.draft_long_data, args.draft_seq_len)
            if args.draft_init is not None and "draft" in log:  # the runs it continues: kept for the card
                log["draft_history"] = [*log.get("draft_history", []), log["draft"]]
            log["draft"] = {k: v for k, v in summary.items() if k != "loss_history"} | {
                "layers": args.draft_layers, "samples": args.draft_samples, "lr": args.draft_lr,
                "init": None if args.draft_init is None else str(args.draft_init),
                "regen_temperature": json.loads((args.work / "draft" / "dflash_trt_train.json").read_text())[
                    "regen_temperature"],  # as the run recorded it
                "distill_temperature": args.draft_distill_temperature,
                "distill_weight": args.draft_distill_weight if args.draft_distill_temperature else None,
                "distill_slots": args.draft_distill_slots if args.draft_distill_temperature else None,
                "prompt_stride": args.draft_prompt_stride, "eval_samples": args.draft_eval_samples,
                "sliding_window": args.draft_sliding_window, "seq_len": args.draft_seq_len,
                "long_data": log.get("long_data") if args.draft_long_data else None,
                "command": " ".join(["python", "scripts/make_tiny_pair.py", *sys.argv[1:]])}
        elif stage == "yarn":
            log["yarn"] = extend_with_yarn(args.work, args.yarn_factor, held_files)
        elif stage == "long-data":
            path = long_samples(args.work, token_stream(args.work, train_files), args.long_new_tokens,
                                args.draft_sliding_window or 256, args.seed)
            log["long_data"] = {"file": path.name, "samples": len(path.read_text().splitlines()),
                                "new_tokens": args.long_new_tokens, "window": args.draft_sliding_window or 256,
                                "command": " ".join(["python", "scripts/make_tiny_pair.py", *sys.argv[1:]])}
        elif stage == "prompts":
            cut_prompts(args.work, held_files, 64, 64, args.seed + 1, "heldout_prompts.jsonl")
            long_prompts(args.work, held_files)
        elif stage == "measure":
            log["measured"] = measure(args.work)
            log["measured_sampled"] = measure_sampled(args.work)
            log["measured_lengths"] = measure_lengths(args.work)
            log["measured_on"] = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d")}
            write_cards(args.work, log, TARGET_SHAPE)
        log.setdefault("seconds", {})[stage] = round(time.perf_counter() - t0)
        log_path.write_text(json.dumps(log, indent=2))
        print(f"stage {stage}: {log['seconds'][stage]} s", flush=True)
    if args.stage == "all":
        install(args.work)


def install(work: Path) -> None:
    """Copy the pair and held-out prompts into dflash_trt/assets/ (replacing the old ones)."""
    for name, src in (("tiny-qwen3", work / "target"), ("tiny-qwen3-dflash", work / "draft")):
        dst = ASSETS / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("generation_config.json"))
    for name in ("heldout_prompts.jsonl", "heldout_long.jsonl"):
        shutil.copy(work / name, ASSETS / name)
    shutil.copy(work / "make_log.json", ASSETS / "make_log.json")




if __name__ == "__main__":
    main()
