"""Draft vocabulary: ranking, the file's checks, proposals restricted to it, lossless decoding, CLI."""

import json
import shutil
from collections import Counter

import pytest
import torch
from click.testing import CliRunner

from dflash_trt.cli import cli
from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.drafts import propose
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.errors import CheckpointError, ConfigError
from dflash_trt.model import draft_vocab as dv
from dflash_trt.model.loader import apply_draft_vocab, load_pair


def test_record_ranks_by_count_and_sizes_by_coverage():
    counts = Counter({5: 50, 9: 30, 2: 30, 7: 15, 1: 5})
    rec = dv.vocab_record(counts, 16, "test", coverage=0.9)
    assert rec["token_ids"] == [5, 2, 9, 7, 1] and rec["counts"] == [50, 30, 30, 15, 5]  # ties: lower id first
    assert rec["recommended_size"] == 5  # the minimum size (64) capped by the ranked tokens
    big = Counter({t: 1000 - t for t in range(200)})
    rec = dv.vocab_record(big, 256, "test", coverage=0.5)
    running = 0
    for n, c in enumerate(rec["counts"], 1):
        running += c
        if running >= 0.5 * sum(big.values()):
            break
    assert rec["recommended_size"] == max(n, dv.MIN_SIZE)
    with pytest.raises(ConfigError, match="outside the vocabulary 0..15"):
        dv.vocab_record(Counter({16: 1}), 16, "test")
    with pytest.raises(ConfigError, match="no tokens"):
        dv.vocab_record(Counter(), 16, "test")


def _folder(tmp_path, record):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / dv.VOCAB_FILE).write_text(record if isinstance(record, str) else json.dumps(record))
    return tmp_path


@pytest.mark.parametrize("edit,field", [
    ({"format": "other"}, "format"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"token_ids": [1, 99]}, "token_ids"),
    ({"token_ids": [1, 1, 2]}, "token_ids"),
    ({"token_ids": []}, "token_ids"),
    ({"recommended_size": 9}, "recommended_size"),
])
def test_bad_vocab_files_name_the_file_and_field(tmp_path, edit, field):
    record = dv.vocab_record(Counter({1: 3, 2: 2, 3: 1}), 16, "test") | edit
    with pytest.raises(CheckpointError) as err:
        dv.read_vocab_file(_folder(tmp_path, record))
    assert dv.VOCAB_FILE in str(err.value) and f"field '{field}'" in str(err.value)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        dv.read_vocab_file(_folder(tmp_path, "{"))


def test_select_sizes():
    rec = dv.vocab_record(Counter({t: 100 - t for t in range(80)}), 128, "test")
    assert dv.select(rec, None, "w") is None and dv.select(rec, "full", "w") is None
    assert dv.select(rec, "auto", "w") == rec["token_ids"][: rec["recommended_size"]]
    assert dv.select(None, "auto", "w") is None
    assert dv.select(rec, 10, "w") == list(range(10))
    assert dv.select(rec, 128, "w") is None  # the whole vocabulary
    with pytest.raises(ConfigError, match="ranks only 80 tokens"):
        dv.select(rec, 100, "w")
    with pytest.raises(ConfigError, match="dflash-trt draft-vocab"):
        dv.select(None, 10, "w")


def _vocab_pair(tiny_pair, tmp_path, ids):
    """The tiny pair with a copy of its drafter carrying a draft vocabulary of `ids` (ranked)."""
    draft_dir = tmp_path / "draft"
    shutil.copytree(tiny_pair[1], draft_dir)
    counts = Counter({t: len(ids) - i for i, t in enumerate(ids)})
    dv.write_vocab_file(draft_dir, dv.vocab_record(counts, 256, "test") | {"recommended_size": len(ids)})
    return load_pair(tiny_pair[0], draft_dir, dtype="fp32", device="cpu")


def test_proposals_are_the_argmax_over_the_vocabulary(tiny_pair, tmp_path):
    ids = torch.randperm(256, generator=torch.Generator().manual_seed(3))[:40].tolist()
    pair = apply_draft_vocab(_vocab_pair(tiny_pair, tmp_path, ids), "auto")
    assert pair.draft.vocab_size == 40
    hidden = torch.randn(3, 7, pair.target.config.dims.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = pair.draft.logits(hidden, pair.target.lm_head)
        outside = torch.ones(256, dtype=torch.bool)
        outside[ids] = False
        expected = full.masked_fill(outside, float("-inf")).argmax(-1)
        start = torch.zeros(3, dtype=torch.int64)
        assert torch.equal(propose(pair.draft, hidden, pair.target.lm_head, start), expected)
        cut = propose(pair.draft, hidden, pair.target.lm_head, start, min_confidence=0.01)
        assert torch.equal(cut, expected[:, : cut.shape[1]])
        apply_draft_vocab(pair, "full")
        assert pair.draft.vocab_size is None
        assert torch.equal(propose(pair.draft, hidden, pair.target.lm_head, start), full.argmax(-1))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_decoding_with_a_draft_vocabulary_is_lossless(tiny_pair, tmp_path, make_requests, temperature):
    from dflash_trt.runtime.local import generate

    requests = make_requests(temperature, n=16, seed=int(temperature * 10) + 1)
    pair = _vocab_pair(tiny_pair, tmp_path, list(range(0, 256, 3)))
    ar = autoregressive_generate(pair.target, requests)
    apply_draft_vocab(pair, 50)
    assert [s.tokens for s in speculative_generate(pair.target, pair.draft, requests, 8)] == [a.tokens for a in ar]
    engine, _ = generate(pair, requests, 8, min_confidence=0.001)  # the engine: CPU heads over the vocabulary
    assert [s.tokens for s in engine] == [a.tokens for a in ar]


def test_vocab_size_must_match_the_target(tiny_pair, tmp_path):
    draft_dir = tmp_path / "draft"
    shutil.copytree(tiny_pair[1], draft_dir)
    dv.write_vocab_file(draft_dir, dv.vocab_record(Counter({1: 1}), 512, "test"))
    pair = load_pair(tiny_pair[0], draft_dir, dtype="fp32", device="cpu")
    with pytest.raises(ConfigError, match="field 'vocab_size': 512 is not the target's vocabulary size 256"):
        apply_draft_vocab(pair, "auto")


def test_draft_vocab_command_writes_a_loadable_vocabulary(tiny_pair, tmp_path):
    draft_dir = tmp_path / "draft"
    shutil.copytree(tiny_pair[1], draft_dir)
    data = tmp_path / "d.jsonl"
    g = torch.Generator().manual_seed(0)
    data.write_text("".join(json.dumps({"token_ids": torch.randint(0, 60, (30,), generator=g).tolist()}) + "\n"
                            for _ in range(20)))
    result = CliRunner().invoke(cli, ["draft-vocab", "--target", str(tiny_pair[0]), "--draft", str(draft_dir),
                                      "--data", str(data), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    rec = dv.read_vocab_file(draft_dir)
    assert set(rec["token_ids"]) <= set(range(60)) and sum(rec["counts"]) == 600
    result = CliRunner().invoke(cli, ["draft-vocab", "--target", str(tiny_pair[0]), "--draft", str(draft_dir),
                                      "--data", str(data), "--regenerate", "--regen-prompt-tokens", "4",
                                      "--regen-new-tokens", "12", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert sum(dv.read_vocab_file(draft_dir)["counts"]) == 20 * 12  # the target's continuations only
    result = CliRunner().invoke(cli, ["draft-vocab", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[0]),
                                      "--data", str(data), "--device", "cpu"])
    assert result.exit_code == 1 and not (tiny_pair[0] / dv.VOCAB_FILE).exists()  # a target is not a drafter
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                      "--prompt-ids", "1,2,3", "--draft-vocab", "20", "--device", "cpu"])
    assert result.exit_code == 1 and "has no dflash_trt_draft_vocab.json" in result.output


def test_the_shipped_drafter_has_a_vocabulary_that_keeps_acceptance():
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.engine.config import ASSETS
    from dflash_trt.runtime.local import generate

    pair = load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", dtype="fp32", device="cpu")
    requests = [Request(tuple(p), stop=StopCriteria(64)) for p in load_prompts(None, None, 4)]
    full = generate(pair, requests, 16, width_policy="schedule")[0]
    apply_draft_vocab(pair, "auto")
    assert 64 <= pair.draft.vocab_size < 4096 // 2  # under half of the head's rows read per draft step
    cut = generate(pair, requests, 16, width_policy="schedule")[0]
    assert [c.tokens for c in cut] == [f.tokens for f in full]
    steps = lambda rs: sum(len(r.acceptance_lengths) for r in rs)
    assert steps(cut) <= 1.05 * steps(full)
