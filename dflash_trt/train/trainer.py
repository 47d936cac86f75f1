"""`train-draft`: train a DFlash drafter for a frozen Hugging Face target, on CPU or CUDA.

The target supplies taps, embeddings and lm_head (all frozen); only the drafter's layers, `fc`,
`hidden_norm` and `norm` train. Progress shows the loss and, at each checkpoint, the τ of
greedy decoding simulated on held-out (or training) samples (`blocks.chain_acceptance_length`).
Training state (drafter, AdamW moments, step, data) is saved as safetensors + JSON beside the
output every `save_every` steps, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dflash_trt.checkpoint.configs import DraftConfig, default_target_layer_ids
from dflash_trt.checkpoint.draft_writer import (
    TRAIN_RECORD,
    check_drafter_out,
    draft_config_for_target,
    write_draft_folder,
)
from dflash_trt.errors import ConfigError
from dflash_trt.model import draft_vocab
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.train import data as train_data
from dflash_trt.train import state as train_state
from dflash_trt.train.blocks import (
    block_loss,
    chain_acceptance_length,
    cosine_lr,
    distill_loss,
    draft_training_logits,
    sample_blocks,
    simulated_acceptance_length,
    target_block_logits,
)
from dflash_trt.train.features import TargetFeatures, features_cache_file


@dataclass
class TrainDraftConfig:
    target: str
    data: list[str]
    out: str
    block_size: int = 16
    layers: int = 1
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    steps: int = 1000
    batch_size: int = 8
    seq_len: int = 256
    num_anchors: int = 32
    lr: float = 6e-4
    gamma: float | None = None  # loss decay; default 7 for block 16, 4 for block 8 (scaled)
    grad_clip: float = 1.0
    regenerate: bool = False
    data_as_is: list[str] = field(default_factory=list)  # samples used as they are, with or without `regenerate`
    regen_prompt_tokens: int = 64
    regen_new_tokens: int = 192
    regen_temperature: float | list[float] = 0.0  # a list: sample i is continued at temperature [i % n]
    # Distillation: None trains on the hard labels only; a temperature T adds KL(p_T || q_T) to the target's
    # own distribution at T (what coupled drafts at serving temperature T need), mixed with the hard-label
    # loss as distill_weight * KL + (1 - distill_weight) * CE.
    distill_temperature: float | None = None
    distill_weight: float = 1.0
    # the KL on block slots 1..distill_slots only (None: every slot). Slot 1's distribution is the target's
    # next-token distribution whatever the temperature; later slots' depend on the tokens before them, which
    # the drafter cannot see (greedy serving wants the greedy chain there, sampled serving the marginal)
    distill_slots: int | None = None
    max_samples: int | None = None
    seed: int = 0
    save_every: int = 200
    device: str = "auto"
    init: str | None = None  # a drafter folder whose weights the run starts from (same shapes and taps)
    sliding_window: int | None = None  # context attention windowed (sliding_attention, not causal)
    eval_samples: int = 0  # samples held out for the chain-simulated τ (0: the first 16 training samples)
    cache_features: bool = False  # keep the dataset's target features on disk for later runs (features_cache_file)
    feature_memory_gb: float = 4.0  # target features of the whole dataset held in memory up to this size, else per step
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if self.distill_temperature is not None and not self.distill_temperature > 0:
            raise ConfigError(f"distill_temperature must be > 0 (or unset), got {self.distill_temperature}")
        if self.distill_slots is not None and not 1 <= self.distill_slots < self.block_size:
            raise ConfigError(f"distill_slots must be in [1, block_size - 1 = {self.block_size - 1}] (or unset), "
                              f"got {self.distill_slots}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ConfigError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        for name in ("eval_samples", "feature_memory_gb"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("layers", "steps", "batch_size", "num_anchors", "save_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.sliding_window or self.block_size) < self.block_size:  # a block sees its own rows
            raise ConfigError(f"sliding_window must be >= block_size ({self.block_size}), got {self.sliding_window}")
        if self.seq_len < 4:
            raise ConfigError(f"seq_len must be >= 4, got {self.seq_len}")
        if isinstance(self.regen_temperature, (list, tuple)):  # one value is recorded as a number, as before lists
            temps = [float(t) for t in self.regen_temperature]
            self.regen_temperature = temps[0] if len(temps) == 1 else temps
        self.data_as_is = list(self.data_as_is)
        if self.gamma is None:
            self.gamma = 7.0 * (self.block_size - 1) / 15

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def default_taps(num_target_layers: int) -> list[int]:
    """Up to 5 distinct taps spread over the target (z-lab's rule, deduplicated for shallow targets)."""
    n = min(5, max(1, num_target_layers - 3))
    return sorted(set(default_target_layer_ids(num_target_layers, n)))


def default_mask_token_id(tokenizer, vocab_size: int) -> int:
    """The tokenizer's mask token, else the first embedding row the tokenizer never emits."""
    if tokenizer is not None and tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    if tokenizer is not None and len(tokenizer) < vocab_size:
        return len(tokenizer)
    raise ConfigError("no mask token: pass --mask-token-id (an embedding row of the target, e.g. an unused one)")


def build_draft_config(cfg: TrainDraftConfig, pair) -> DraftConfig:
    tc = pair.target.config
    taps = cfg.target_layer_ids or default_taps(tc.dims.num_layers)
    if any(not 0 <= t < tc.dims.num_layers for t in taps):
        raise ConfigError(f"--target-layer-ids {taps}: outside the target's layers 0..{tc.dims.num_layers - 1}")
    mask = cfg.mask_token_id if cfg.mask_token_id is not None else default_mask_token_id(pair.tokenizer, tc.vocab_size)
    if not 0 <= mask < tc.vocab_size:
        raise ConfigError(f"--mask-token-id {mask}: not a row of the target embedding (vocab {tc.vocab_size})")
    return draft_config_for_target(tc, cfg.layers, cfg.block_size, mask, tuple(taps), cfg.sliding_window)


def new_draft(config: DraftConfig, seed: int, device) -> DFlashDraft:
    torch.manual_seed(seed)
    draft = DFlashDraft(config)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return draft.to(device)


def start_from(draft: DFlashDraft, folder: str) -> None:
    """Load the weights of the drafter in `folder` (z-lab format, safetensors) into `draft`, which must
    have the same hidden size, tapped layers and block size (fine-tuning / training longer). A
    shallower drafter grows: its layers become the first ones, and each extra layer starts as the
    identity (o_proj and down_proj zero, so it adds nothing to the residual stream), which leaves the
    drafter's outputs unchanged at step 0."""
    from dflash_trt.checkpoint.hf import read_draft
    from dflash_trt.model.loader import load_draft

    ckpt = read_draft(folder)
    want, got = draft.config, ckpt.config
    for name, a, b in (("hidden_size", want.dims.hidden_size, got.dims.hidden_size),
                       ("target_layer_ids", tuple(want.target_layer_ids), tuple(got.target_layer_ids)),
                       ("block_size", want.block_size, got.block_size),
                       ("mask_token_id", want.mask_token_id, got.mask_token_id)):
        if a != b:
            raise ConfigError(f"--init {folder}: its {name} is {b}, this run's is {a}")
    extra = want.dims.num_layers - got.dims.num_layers
    if extra < 0:
        raise ConfigError(f"--init {folder}: it has {got.dims.num_layers} layers, more than this run's "
                          f"{want.dims.num_layers} (a drafter can grow deeper, not shallower)")
    weight = next(draft.parameters())
    state = load_draft(ckpt, weight.dtype, weight.device, fuse=False).state_dict()
    with torch.no_grad():
        result = draft.load_state_dict(state, strict=False)
        grown = tuple(f"layers.{i}." for i in range(got.dims.num_layers, want.dims.num_layers))
        assert not result.unexpected_keys and all(k.startswith(grown) for k in result.missing_keys), result
        for layer in draft.layers[got.dims.num_layers:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def prepare_samples(cfg: TrainDraftConfig, pair, state_dir: Path, progress) -> list:
    """Read (and regenerate) the training samples once; cached in the state folder for resume. The `data_as_is`
    samples come first, so `eval_samples` are held out of `data`'s."""
    cached = state_dir / "samples.jsonl"
    if cached.is_file():
        samples = train_data.load_samples(cached)
    else:
        samples = train_data.read_samples([Path(p) for p in cfg.data], pair.tokenizer, cfg.seq_len)
        if cfg.max_samples:
            samples = samples[: cfg.max_samples]
        if cfg.regenerate:
            task = progress.add_task("regenerate with target", total=len(samples))
            stop_ids = frozenset(pair.target.config.eos_token_ids)
            samples = train_data.regenerate(
                pair.target, samples, cfg.regen_prompt_tokens, cfg.regen_new_tokens, cfg.regen_temperature,
                cfg.seed, stop_ids=stop_ids, progress=lambda n: progress.advance(task, n),
            )
        if cfg.data_as_is:
            samples = train_data.read_samples([Path(p) for p in cfg.data_as_is], pair.tokenizer, cfg.seq_len) + samples
        train_data.save_samples(cached, samples)
    if cfg.sliding_window is None and any(s.drafter_from for s in samples):
        raise ConfigError("samples with drafter_from need a windowed drafter (--sliding-window): a full-attention "
                          "drafter reads every position before its block, which those rows leave out")
    return samples


def train_draft(cfg: TrainDraftConfig) -> dict:
    """Train, write the z-lab drafter folder to `cfg.out`, return a summary (loss, τ estimate)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from dflash_trt.model.loader import load_pair

    check_drafter_out(cfg.out)  # before hours of training, not after
    pair = load_pair(cfg.target, None, dtype="fp32", device=cfg.device)
    device = pair.target.lm_head.weight.device
    state_dir = Path(f"{cfg.out}.train-state")
    state_dir.mkdir(parents=True, exist_ok=True)
    draft_config = build_draft_config(cfg, pair)
    draft = new_draft(draft_config, cfg.seed, device)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step = train_state.load(state_dir, cfg, draft, optimizer)
    if step == 0 and cfg.init is not None:  # a resumed run has its own weights already
        start_from(draft, cfg.init)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn())
    with Progress(*columns) as progress:
        samples = prepare_samples(cfg, pair, state_dir, _FieldProgress(progress))
        tokens, loss_mask = train_data.pack(samples, cfg.seq_len, pad_id=0)
        contexts = train_data.contexts(samples)
        held_out = cfg.eval_samples
        if held_out and held_out > len(samples) // 2:
            raise ConfigError(f"--eval-samples {held_out}: keep at least half of the {len(samples)} samples for training")
        train_count = len(samples) - held_out
        eval_rows = list(range(train_count, len(samples))) if held_out else list(range(min(16, len(samples))))
        task = progress.add_task("train drafter", total=cfg.steps, completed=step, info="")
        summary = _loop(cfg, pair.target, draft, optimizer, tokens, loss_mask, step, state_dir, progress, task,
                        train_count, eval_rows, contexts)
        summary["chain_tau_on"] = f"{len(eval_rows)} {'held-out' if held_out else 'training'} samples"
    vocab = draft_vocab.vocab_record(draft_vocab.count_tokens([tokens[loss_mask].tolist()]),
                                     pair.target.config.vocab_size, f"the {len(samples)} training samples' trained tokens")
    write_draft_folder(cfg.out, draft_config, draft.state_dict(), extra_files={
        draft_vocab.VOCAB_FILE: json.dumps(vocab) + "\n",
        TRAIN_RECORD: cfg.to_json(),
        "README.md": model_card(cfg, draft_config, summary, len(samples)),
    })
    return summary


class _FieldProgress:
    """Adapter so helper tasks get an empty `info` field."""

    def __init__(self, progress):
        self.progress = progress

    def add_task(self, description, total):
        return self.progress.add_task(description, total=total, info="")

    def advance(self, task, n):
        self.progress.advance(task, n)


@torch.enable_grad()  # robust to a caller that disabled autograd globally
def _loop(cfg, target, draft, optimizer, tokens, loss_mask, step, state_dir, progress, task, train_count,
          eval_rows, contexts=None) -> dict:
    """The optimisation loop: batch -> target taps -> blocks -> drafter -> decayed CE. Training rows are
    the first `train_count`; `eval_rows` give the chain-simulated τ at each save and at the end."""
    taps = tuple(draft.config.target_layer_ids)
    distill = cfg.distill_temperature is not None
    cache_file = features_cache_file(cfg.target, taps, tokens, distill, contexts) if cfg.cache_features else None
    features = TargetFeatures(target, tokens, taps, budget_bytes=cfg.feature_memory_gb * 1e9, cache_file=cache_file,
                              final=distill, contexts=contexts)
    width = len(taps) * target.config.dims.hidden_size  # the taps' columns of a feature row

    def chain_tau() -> float:
        draft.eval()
        tau = chain_acceptance_length(draft, target, lambda rows: features(rows)[..., :width], tokens, loss_mask,
                                      eval_rows, cfg.block_size, cfg.seq_len)[0]
        draft.train()
        return tau

    draft.train()
    recent, history, t0, chain, last_tau = [], [], time.perf_counter(), "", float("nan")
    while step < cfg.steps:
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(0, train_count, (cfg.batch_size,), generator=g)
        batch_tokens, batch_mask = tokens[rows], loss_mask[rows]
        rows_features = features(rows)
        target_hidden = rows_features[..., :width]
        blocks = sample_blocks(batch_tokens, batch_mask, cfg.num_anchors, cfg.block_size,
                               draft.config.mask_token_id, cfg.gamma, g)
        logits = draft_training_logits(draft, target, target_hidden, blocks)
        loss, accuracy = block_loss(logits, blocks)
        if distill:
            teacher = target_block_logits(rows_features[..., width:], target.lm_head, blocks)
            kd = distill_loss(logits, teacher, blocks, cfg.distill_temperature, cfg.distill_slots)
            loss = cfg.distill_weight * kd + (1 - cfg.distill_weight) * loss
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, cfg.steps, cfg.lr)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        recent = (recent + [(loss.item(), accuracy.detach())])[-20:]
        history.append(round(recent[-1][0], 5))
        if step % cfg.save_every == 0 or step == cfg.steps:
            train_state.save(state_dir, cfg, draft, optimizer, step)
            last_tau = chain_tau()
            chain = f"  τ {last_tau:.2f} (chain-simulated, {len(eval_rows)} samples)"
        progress.update(task, completed=step, info=f"loss {recent[-1][0]:.3f}{chain}")
    draft.eval()
    mean_acc = torch.stack([a for _, a in recent]).mean(0) if recent else torch.zeros(0)
    return {
        "steps": step,
        "final_loss": sum(l for l, _ in recent) / len(recent) if recent else float("nan"),
        "loss_history": history,  # this run's steps only (a resumed run starts mid-way)
        "slot_accuracy": [round(float(a), 4) for a in mean_acc],
        "simulated_tau": simulated_acceptance_length(mean_acc),
        "chain_tau": last_tau if recent else chain_tau(),  # the run's last step saved and measured it
        "seconds": time.perf_counter() - t0,
    }


def model_card(cfg: TrainDraftConfig, config: DraftConfig, summary: dict, n_samples: int) -> str:
    d = config.dims
    return f"""# DFlash drafter (trained with `dflash-trt train-draft`)

- target: `{cfg.target}`
- layers: {d.num_layers}, hidden {d.hidden_size}, heads {d.num_heads}/{d.num_kv_heads}, block_size {config.block_size}
- target_layer_ids: {list(config.target_layer_ids)}, mask_token_id: {config.mask_token_id}
- data: {cfg.data} ({n_samples} samples, regenerated by the target: {cfg.regenerate})
- steps: {summary['steps']}, batch {cfg.batch_size} x {cfg.seq_len} tokens, {cfg.num_anchors} anchors, lr {cfg.lr}, gamma {cfg.gamma:.2f}
- final training loss {summary['final_loss']:.3f}; τ of greedy decoding simulated over {summary['chain_tau_on']}
  (the drafter's block at every position, the decoding chain walked): {summary['chain_tau']:.2f}
  (the product of per-slot accuracies, {summary['simulated_tau']:.2f}, overstates it: easy stretches take few steps)
- per-slot training accuracy: {summary['slot_accuracy']}

Training settings: `dflash_trt_train.json`. Measured acceptance: run `dflash-trt bench --local`.
"""
