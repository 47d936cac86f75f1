"""train-draft: the loss falls, the output folder loads in our runtime and in z-lab's dflash."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
from dflash_trt.cli import cli
from dflash_trt.errors import ConfigError
from dflash_trt.train.blocks import block_attention_mask, sample_blocks
from dflash_trt.train.trainer import TrainDraftConfig

pytestmark = pytest.mark.slow  # trains drafters


def _data(path, n=48, length=40):
    g = torch.Generator().manual_seed(0)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"token_ids": torch.randint(0, 250, (length,), generator=g).tolist()}) + "\n")
    return path


def _train(target, data, out, steps, extra=()):
    args = ["train-draft", "--target", str(target), "--data", str(data), "--out", str(out), "--steps", str(steps),
            "--block-size", "8", "--seq-len", "48", "--batch-size", "4", "--num-anchors", "8",
            "--mask-token-id", "255", "--regenerate", "--regen-prompt-tokens", "8", "--regen-new-tokens", "40",
            "--lr", "3e-3", "--save-every", "10", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


def test_training_lowers_loss_and_output_loads_in_both_loaders(tiny_pair, tmp_path):
    target = tiny_pair[0]
    summary = _train(target, _data(tmp_path / "d.jsonl"), tmp_path / "draft", 60)
    history = summary["loss_history"]
    assert sum(history[-10:]) / 10 < sum(history[:10]) / 10 - 0.25
    ckpt = read_draft(tmp_path / "draft")
    check_pair(read_target(target), ckpt)
    assert ckpt.config.block_size == 8 and ckpt.config.mask_token_id == 255
    from tiny_models import oracle_draft

    oracle = oracle_draft(json.loads((tmp_path / "draft" / "config.json").read_text()))
    missing, unexpected = oracle.load_state_dict(load_file(str(tmp_path / "draft" / "model.safetensors")), strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m]
    from dflash_trt.model.draft_vocab import read_vocab_file

    vocab = read_vocab_file(tmp_path / "draft")  # the tokens it was trained to propose: regenerated ones
    assert vocab["vocab_size"] == 256 and sum(vocab["counts"]) == 48 * 40


def test_resume_continues_from_saved_step(tiny_pair, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    _train(tiny_pair[0], data, tmp_path / "draft", 20)
    state = json.loads((tmp_path / "draft.train-state" / "state.json").read_text())
    assert state["step"] == 20
    more = _train(tiny_pair[0], data, tmp_path / "draft", 20)  # same settings: nothing left to do
    assert more["steps"] == 20 and more["loss_history"] == []


def test_resume_with_other_settings_is_refused(tiny_pair, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    _train(tiny_pair[0], data, tmp_path / "draft", 10)
    args = ["train-draft", "--target", str(tiny_pair[0]), "--data", str(data), "--out", str(tmp_path / "draft"),
            "--steps", "10", "--block-size", "4", "--mask-token-id", "255"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "other settings" in result.output


def test_anchor_blocks_see_only_strictly_earlier_context():
    tokens = torch.arange(20)[None]
    mask = torch.ones(1, 20, dtype=torch.bool)
    batch = sample_blocks(tokens, mask, num_anchors=3, block_size=4, mask_token_id=99, gamma=4.0,
                          generator=torch.Generator().manual_seed(0))
    anchors = batch.anchors[0].tolist()
    assert all(1 <= a <= 18 for a in anchors)
    for n, a in enumerate(anchors):
        assert batch.block_tokens[0, 4 * n : 4 * n + 4].tolist() == [a, 99, 99, 99]
        expected = [a + k if a + k < 20 else -100 for k in range(1, 4)]
        assert batch.labels[0, n].tolist() == expected
    visible = block_attention_mask(batch.anchors, 20, 4, causal=False, window=None)[0, 0]
    for n, a in enumerate(anchors):
        row = visible[4 * n]
        assert row[:20].tolist() == [k < a for k in range(20)]
        assert row[20:].tolist() == [m // 4 == n for m in range(12)]


def test_anchors_respect_loss_mask():
    tokens = torch.arange(30)[None]
    mask = torch.zeros(1, 30, dtype=torch.bool)
    mask[0, 20:] = True
    batch = sample_blocks(tokens, mask, 8, 4, 99, 4.0, torch.Generator().manual_seed(1))
    used = [a for a in batch.anchors[0].tolist() if a >= 0]
    assert used and all(a + 1 >= 20 for a in used)
    assert all(v == -100 or v >= 20 for v in batch.labels.flatten().tolist())


def test_init_starts_from_an_existing_drafter(tiny_pair, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    first = _train(tiny_pair[0], data, tmp_path / "a", 30)
    # a 1-step run at a negligible lr: the start really is the first drafter's weights
    again = _train(tiny_pair[0], data, tmp_path / "b", 1, ("--init", str(tmp_path / "a"), "--lr", "1e-9"))
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert again["loss_history"][0] < first["loss_history"][0] - 0.25  # started trained, not from noise
    fresh = _train(tiny_pair[0], data, tmp_path / "c", 1, ("--lr", "1e-9"))
    assert fresh["loss_history"][0] > again["loss_history"][0] + 0.25


def test_init_grows_a_shallower_drafter_without_changing_its_outputs(tiny_pair, tmp_path):
    from dflash_trt.model.loader import load_pair

    data = _data(tmp_path / "d.jsonl")
    _train(tiny_pair[0], data, tmp_path / "a", 20, ("--layers", "1"))
    _train(tiny_pair[0], data, tmp_path / "b", 1, ("--layers", "2", "--init", str(tmp_path / "a"), "--lr", "1e-9"))
    assert read_draft(tmp_path / "b").config.dims.num_layers == 2
    grown = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert grown["layers.1.mlp.down_proj.weight"].abs().max() < 1e-6 < grown["layers.1.mlp.up_proj.weight"].abs().max()
    outputs = []
    for folder in ("a", "b"):
        pair = load_pair(tiny_pair[0], tmp_path / folder, dtype="fp32", device="cpu")
        g = torch.Generator().manual_seed(1)
        n_taps = len(pair.draft.config.target_layer_ids) * pair.target.config.dims.hidden_size
        cache, slots = pair.draft.new_cache(1, 32), torch.tensor([0])
        with torch.inference_mode():
            pair.draft.append_context(torch.randn(1, 10, n_taps, generator=g), torch.arange(10)[None], cache, slots)
            block = pair.target.embed(torch.tensor([[7] + [255] * 7]))
            outputs.append(pair.draft(block, torch.arange(10, 18)[None], cache, slots))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=1e-5)
    args = ["train-draft", "--target", str(tiny_pair[0]), "--data", str(data), "--out", str(tmp_path / "c"),
            "--steps", "1", "--block-size", "8", "--mask-token-id", "255", "--init", str(tmp_path / "b")]
    result = CliRunner().invoke(cli, args)  # --layers defaults to 1
    assert result.exit_code == 1 and "it has 2 layers, more than this run's 1" in result.output


def test_init_with_other_taps_is_refused(tiny_pair, tmp_path):
    data = _data(tmp_path / "d.jsonl")
    _train(tiny_pair[0], data, tmp_path / "a", 2)
    args = ["train-draft", "--target", str(tiny_pair[0]), "--data", str(data), "--out", str(tmp_path / "b"),
            "--steps", "1", "--block-size", "4", "--mask-token-id", "255", "--init", str(tmp_path / "a")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "its block_size is 8, this run's is 4" in result.output


def test_chain_simulated_tau_equals_decoding_the_same_prompts():
    """On target-greedy data, chain_acceptance_length predicts greedy DFlash decoding's τ (shipped pair)."""
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.decoding.reference import speculative_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.engine.config import ASSETS
    from dflash_trt.model.loader import load_pair
    from dflash_trt.train.blocks import chain_acceptance_length
    from dflash_trt.train.data import Sample, pack
    from dflash_trt.train.trainer import TargetFeatures

    pair = load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", dtype="fp32", device="cpu")
    prompts = load_prompts(None, None, 6)
    committed = steps = 0
    samples = []
    with torch.inference_mode():
        for p in prompts:
            result = speculative_generate(pair.target, pair.draft, [Request(tuple(p), stop=StopCriteria(80))], 16)[0]
            committed += sum(result.acceptance_lengths)
            steps += len(result.acceptance_lengths)
            samples.append(Sample(list(p) + result.tokens, len(p)))
    tokens, mask = pack(samples, max(len(s.tokens) for s in samples), pad_id=0)
    features = TargetFeatures(pair.target, tokens, tuple(pair.draft.config.target_layer_ids))
    tau, sim_steps = chain_acceptance_length(pair.draft, pair.target, features, tokens, mask, list(range(6)), 16, 80)
    assert committed / steps > 2.0  # a trained pair: the comparison means something
    assert abs(sim_steps - steps) <= 2 and tau == pytest.approx(committed / steps, rel=0.02)  # measured: equal


def test_held_out_samples_are_not_trained_on_and_name_the_tau(tiny_pair, tmp_path, monkeypatch):
    from dflash_trt.train import trainer

    rows, features = [], trainer.TargetFeatures.__call__
    monkeypatch.setattr(trainer.TargetFeatures, "__call__", lambda self, r: rows.append(r.tolist()) or features(self, r))
    data = _data(tmp_path / "d.jsonl")
    summary = _train(tiny_pair[0], data, tmp_path / "a", 12, ("--eval-samples", "8"))
    assert summary["chain_tau_on"] == "8 held-out samples" and summary["chain_tau"] >= 1.0
    batches = [r for r in rows if len(r) == 4]  # training batches (--batch-size 4); evaluation reads one row
    assert len(batches) == 12 and max(max(b) for b in batches) < 40
    assert sorted({r[0] for r in rows if len(r) == 1}) == list(range(40, 48))
    card = (tmp_path / "a" / "README.md").read_text()
    assert "simulated over 8 held-out samples" in card
    summary = _train(tiny_pair[0], data, tmp_path / "b", 2)
    assert summary["chain_tau_on"] == "16 training samples"
    result = CliRunner().invoke(cli, ["train-draft", "--target", str(tiny_pair[0]), "--data", str(data), "--out",
                                      str(tmp_path / "c"), "--steps", "1", "--mask-token-id", "255",
                                      "--eval-samples", "40"])
    assert result.exit_code == 1 and "--eval-samples 40: keep at least half of the 48 samples" in result.output


def test_cached_features_are_reused_and_give_the_same_run(tiny_pair, tmp_path, monkeypatch):
    from dflash_trt.train import trainer

    monkeypatch.setenv("DFLASH_TRT_CACHE_DIR", str(tmp_path / "cache"))
    computed = []
    compute = trainer.TargetFeatures._compute
    monkeypatch.setattr(trainer.TargetFeatures, "_compute", lambda self, b: computed.append(len(b)) or compute(self, b))
    data = _data(tmp_path / "d.jsonl")
    first = _train(tiny_pair[0], data, tmp_path / "a", 3, ("--cache-features",))
    files = list((tmp_path / "cache" / "train_features").glob("*.safetensors"))
    assert len(files) == 1 and sum(computed) == 48
    computed.clear()
    again = _train(tiny_pair[0], data, tmp_path / "b", 3, ("--cache-features",))
    assert not computed and again["loss_history"] == first["loss_history"]
    _train(tiny_pair[0], data, tmp_path / "c", 1, ("--cache-features", "--target-layer-ids", "0,1"))
    assert sum(computed) == 48 and len(list((tmp_path / "cache" / "train_features").glob("*.safetensors"))) == 2


def test_features_over_the_memory_budget_are_computed_per_step_with_the_same_run(tiny_pair, tmp_path, monkeypatch):
    from dflash_trt.train import trainer

    computed = []
    compute = trainer.TargetFeatures._compute
    monkeypatch.setattr(trainer.TargetFeatures, "_compute", lambda self, b: computed.append(len(b)) or compute(self, b))
    data = _data(tmp_path / "d.jsonl")
    table = _train(tiny_pair[0], data, tmp_path / "a", 3)
    assert sum(computed) == 48  # the whole dataset once
    computed.clear()
    per_step = _train(tiny_pair[0], data, tmp_path / "b", 3, ("--feature-memory-gb", "0"))
    assert computed[:3] == [4, 4, 4]  # one training batch a step, no table
    assert per_step["loss_history"] == pytest.approx(table["loss_history"], rel=1e-5)


def test_distill_loss_is_zero_at_the_teacher_and_positive_elsewhere():
    from dflash_trt.train.blocks import distill_loss

    tokens = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(3))
    batch = sample_blocks(tokens, torch.ones_like(tokens, dtype=torch.bool), 4, 5, 49, 7.0,
                          torch.Generator().manual_seed(4))
    teacher = torch.randn(2, 4, 4, 50, generator=torch.Generator().manual_seed(5))
    assert float(distill_loss(teacher.clone(), teacher, batch, 0.7)) < 1e-6
    assert float(distill_loss(teacher.flip(-1), teacher, batch, 0.7)) > 0.1
    student = teacher.clone().requires_grad_(True)
    distill_loss(student * 0.5, teacher, batch, 1.0).backward()  # flatter than the teacher: a gradient to sharpen
    assert student.grad.abs().sum() > 0


def test_distill_slots_restrict_the_kl_to_the_first_slots():
    """With slots=1 only slot 1's distribution counts: a student wrong at later slots alone costs nothing, one
    wrong at slot 1 costs what it costs among every slot's KL divided by slot 1's share of the weights."""
    from dflash_trt.train.blocks import distill_loss

    tokens = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(3))
    batch = sample_blocks(tokens, torch.ones_like(tokens, dtype=torch.bool), 4, 5, 49, 7.0,
                          torch.Generator().manual_seed(4))
    teacher = torch.randn(2, 4, 4, 50, generator=torch.Generator().manual_seed(5))
    later_wrong, first_wrong = teacher.clone(), teacher.clone()
    later_wrong[:, :, 1:] = later_wrong[:, :, 1:].flip(-1)
    first_wrong[:, :, :1] = first_wrong[:, :, :1].flip(-1)
    assert float(distill_loss(later_wrong, teacher, batch, 1.0, slots=1)) < 1e-6
    assert float(distill_loss(later_wrong, teacher, batch, 1.0)) > 0.1
    w = batch.weights * (batch.labels != -100)  # [Bt, N, B-1]: the decay, masked past the rows' ends
    share = float(w[..., 0].sum() / w.sum())
    torch.testing.assert_close(distill_loss(first_wrong, teacher, batch, 1.0, slots=1) * share,
                               distill_loss(first_wrong, teacher, batch, 1.0), rtol=1e-5, atol=1e-6)


def test_target_block_logits_are_the_targets_own_next_token_logits(tiny_pair):
    """Slot k of anchor a gets the target's logits at position a + k - 1 (those that predict the slot's label)."""
    from dflash_trt.model.loader import load_pair
    from dflash_trt.train.blocks import target_block_logits

    pair = load_pair(tiny_pair[0], None, dtype="fp32", device="cpu")
    tokens = torch.randint(0, 250, (1, 24), generator=torch.Generator().manual_seed(6))
    cache = pair.target.new_cache(1, 24)
    positions = torch.arange(24)[None]
    logits, _ = pair.target(tokens, positions, cache, torch.tensor([0]))
    cache = pair.target.new_cache(1, 24)
    final, _ = pair.target(tokens, positions, cache, torch.tensor([0]), head=False)
    batch = sample_blocks(tokens, torch.ones_like(tokens, dtype=torch.bool), 3, 4, 255, 7.0,
                          torch.Generator().manual_seed(7))
    got = target_block_logits(final, pair.target.lm_head, batch)  # [1, 3, 3, V]
    for n, a in enumerate(batch.anchors[0].tolist()):
        for k in range(1, 4):
            if a + k < 24:
                torch.testing.assert_close(got[0, n, k - 1], logits[0, a + k - 1], atol=1e-5, rtol=1e-5)


def test_distilled_training_at_a_sampling_temperature(tiny_pair, tmp_path):
    """--regenerate-temperature samples the data, --distill-temperature trains on the target's soft labels."""
    summary = _train(tiny_pair[0], _data(tmp_path / "d.jsonl", n=24), tmp_path / "draft", 30,
                     ["--regenerate-temperature", "0.8", "--distill-temperature", "0.8", "--distill-weight", "0.7"])
    history = summary["loss_history"]
    assert sum(history[-5:]) / 5 < sum(history[:5]) / 5  # the mixed loss falls
    record = json.loads((tmp_path / "draft" / "dflash_trt_train.json").read_text())
    assert record["distill_temperature"] == 0.8 and record["regen_temperature"] == 0.8
    for option in (["--distill-weight", "1.5"], ["--distill-slots", "0"]):
        bad = CliRunner().invoke(cli, ["train-draft", "--target", str(tiny_pair[0]), "--data", str(tmp_path / "d.jsonl"),
                                       "--out", str(tmp_path / "x"), *option])
        assert bad.exit_code == 2, option
    with pytest.raises(ConfigError, match="distill_slots must be in"):
        TrainDraftConfig(target="t", data=[], out="o", block_size=4, distill_slots=4)


def test_regeneration_mixes_a_list_of_temperatures(tiny_pair, tmp_path):
    """--regenerate-temperature 0,1.0: sample i is continued at the (i mod 2)-th temperature — the greedy
    samples are the target's greedy decoding, the others its seeded sampling (seed + i), each as AR gives it."""
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.model.loader import load_pair
    from dflash_trt.train import data as train_data

    pair = load_pair(tiny_pair[0], None, dtype="fp32", device="cpu")
    samples = [train_data.Sample(list(range(3 + i, 11 + i)), 0) for i in range(4)]
    mixed = train_data.regenerate(pair.target, samples, 8, 12, [0.0, 1.0], seed=5, batch_size=3)
    for i, (sample, got) in enumerate(zip(samples, mixed)):
        params = SamplingParams(temperature=[0.0, 1.0][i % 2], seed=5 + i)
        (want,) = autoregressive_generate(pair.target, [Request(tuple(sample.tokens), params, StopCriteria(12))])
        assert got.tokens == sample.tokens + want.tokens and got.trained_from == 8
    assert mixed[1].tokens != train_data.regenerate(pair.target, samples[1:2], 8, 12, 0.0, seed=6)[0].tokens
    summary = _train(tiny_pair[0], _data(tmp_path / "d.jsonl", n=8), tmp_path / "draft", 2,
                     ["--regenerate", "--regenerate-temperature", "0,1.0"])
    assert summary["steps"] == 2
    record = json.loads((tmp_path / "draft" / "dflash_trt_train.json").read_text())
    assert record["regen_temperature"] == [0.0, 1.0]


def test_a_windowed_drafter_keeps_plain_rope_beside_a_yarn_target(tmp_path):
    """--sliding-window: every layer z-lab's sliding_attention, not causal, with the window written where z-lab's
    loader reads it; the window (within the target's original rope window) keeps plain rope; the folder loads
    with each layer's window and trains past what a block sees without it."""
    from tiny_models import make_target

    make_target(tmp_path / "t", "qwen3", seed=2, max_position_embeddings=256,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    summary = _train(tmp_path / "t", _data(tmp_path / "d.jsonl"), tmp_path / "draft", 20, ["--sliding-window", "12"])
    assert summary["loss_history"][-1] < summary["loss_history"][0]
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] and config["sliding_window"] == 12
    assert config["use_sliding_window"] is True and config["is_causal"] is False
    assert config["rope_parameters"]["rope_type"] == "default"
    ckpt = read_draft(tmp_path / "draft")
    assert ckpt.config.layer_window(0) == 12 and not ckpt.config.layer_is_causal(0)
    assert ckpt.config.dims.rope.type == "default" and read_target(tmp_path / "t").config.dims.rope.type == "yarn"
    with pytest.raises(ConfigError, match="sliding_window must be >= block_size"):
        TrainDraftConfig(target="t", data=["d"], out="o", block_size=16, sliding_window=8)


def _long_records(path, n=8, length=40, drafter_from=24, trained_from=30):
    g = torch.Generator().manual_seed(1)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"token_ids": torch.randint(2, 250, (length,), generator=g).tolist(),
                                "trained_from": trained_from, "drafter_from": drafter_from}) + "\n")
    return path


def test_a_row_after_a_long_prefix_has_the_targets_features_of_the_whole_sequence(tiny_pair, tmp_path):
    """drafter_from: the drafter's row starts there, its features are what the target computes at those positions
    having read every token before them (the same as over the whole sequence), not the row's alone."""
    from dflash_trt.model.loader import load_pair
    from dflash_trt.train import data as train_data
    from dflash_trt.train.features import TargetFeatures

    pair = load_pair(tiny_pair[0], None, dtype="fp32", device="cpu")
    samples = train_data.load_samples(_long_records(tmp_path / "long.jsonl", n=3))
    samples.append(train_data.Sample(list(range(5, 21)), 4))  # no prefix: batched beside the others
    tokens, mask = train_data.pack(samples, 16, pad_id=0)
    assert tokens[0].tolist() == samples[0].tokens[24:] and mask[0].tolist() == [False] * 6 + [True] * 10
    taps = (0, 2)
    got = TargetFeatures(pair.target, tokens, taps, contexts=train_data.contexts(samples))
    whole = TargetFeatures(pair.target, torch.tensor([s.tokens for s in samples[:3]]), taps)
    alone = TargetFeatures(pair.target, tokens, taps)
    rows = torch.arange(4)
    torch.testing.assert_close(got(rows)[:3], whole(torch.arange(3))[:, 24:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got(rows)[3], alone(rows)[3])
    assert (got(rows)[:3] - alone(rows)[:3]).abs().max() > 1e-2  # the prefix changes them
    assert train_data.contexts(samples[3:]) is None


def test_data_as_is_trains_a_windowed_drafter_beside_regenerated_data(tiny_pair, tmp_path):
    """--data-as-is: samples after long prefixes, used as they are while --data is regenerated; they come first
    (held-out samples are --data's); a drafter without a window is refused them; bad records name the line."""
    long = _long_records(tmp_path / "long.jsonl")
    summary = _train(tiny_pair[0], _data(tmp_path / "d.jsonl", n=16), tmp_path / "draft", 12,
                     ["--data-as-is", str(long), "--sliding-window", "12", "--seq-len", "24", "--eval-samples", "4"])
    assert summary["steps"] == 12 and summary["chain_tau_on"] == "4 held-out samples"
    cached = [json.loads(line) for line in (tmp_path / "draft.train-state" / "samples.jsonl").read_text().splitlines()]
    assert [r.get("drafter_from", 0) for r in cached] == [24] * 8 + [0] * 16
    assert cached[0]["token_ids"] == json.loads(long.read_text().splitlines()[0])["token_ids"]
    result = CliRunner().invoke(cli, ["train-draft", "--target", str(tiny_pair[0]), "--data", str(long), "--out",
                                      str(tmp_path / "full"), "--steps", "1", "--mask-token-id", "255"])
    assert result.exit_code == 1 and "need a windowed drafter (--sliding-window)" in result.output
    bad = _long_records(tmp_path / "bad.jsonl", n=2, drafter_from=31, trained_from=30)
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: expected 0 <= drafter_from \(31\) <= trained_from \(30\)"):
        from dflash_trt.train.data import load_samples

        load_samples(bad)
