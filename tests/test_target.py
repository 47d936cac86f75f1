"""Our torch target equals Hugging Face transformers (fp32) — logits, taps, cached decoding."""

import pytest
import torch
from tiny_models import make_target

from dflash_trt.checkpoint.hf import read_target
from dflash_trt.model.loader import load_target

LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
YARN_ROPE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}  # 41 positions: past it
YARN_ROPE_FULL = {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 12, "beta_fast": 16.0,
                  "beta_slow": 2.0, "attention_factor": 0.9, "truncate": False}
CASES = {
    "qwen3_gqa": ("qwen3", {}),
    "qwen3_tied_mha": ("qwen3", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "qwen3_bias": ("qwen3", {"attention_bias": True, "rope_theta": 1e6}),
    "llama_gqa_llama3_rope": ("llama", {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "llama_linear_rope_mlp_bias": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "mlp_bias": True}),
    "llama_tied_no_head_dim": ("llama", {"tie_word_embeddings": True, "head_dim": None}),
    "qwen3_yarn": ("qwen3", {"rope_scaling": YARN_ROPE, "max_position_embeddings": 64}),
    "llama_yarn_every_field": ("llama", {"rope_scaling": YARN_ROPE_FULL, "rope_theta": 500000.0}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def target_case(request, tmp_path_factory):
    family, overrides = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_target(folder, family, seed=3, **overrides)
    return hf, load_target(read_target(folder))


def test_logits_and_taps_match_transformers(target_case):
    hf, ours = target_case
    ids = torch.randint(0, 256, (3, 41), generator=torch.Generator().manual_seed(0))
    ref = hf(ids, output_hidden_states=True)
    cache = ours.new_cache(3, 64)
    positions = torch.arange(41)[None].expand(3, -1)
    last = ours.config.dims.num_layers - 1
    logits, taps = ours(ids, positions, cache, torch.arange(3), tap_layers=(0, 2, last))
    assert (logits - ref.logits).abs().max() <= 1e-4
    expected = torch.cat([ref.hidden_states[1], ref.hidden_states[3], ref.hidden_states[last + 1]], dim=-1)
    assert (taps - expected).abs().max() <= 1e-4


def test_cached_chunks_match_full_forward_on_ragged_rows(target_case):
    hf, ours = target_case
    ids = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(1))
    ref = hf(ids).logits
    cache = ours.new_cache(2, 64)
    slots = torch.arange(2)
    # row 0 advances 12 then 18 tokens, row 1 advances 5 then 25 (ragged positions per row)
    split = torch.tensor([12, 5])
    outs = [[], []]
    for b in range(2):
        s = int(split[b])
        for lo, hi in ((0, s), (s, 30)):
            logits, _ = ours(ids[b : b + 1, lo:hi], torch.arange(lo, hi)[None], cache, slots[b : b + 1])
            outs[b].append(logits[0])
    for b in range(2):
        assert (torch.cat(outs[b]) - ref[b]).abs().max() <= 1e-4


def test_a_long_pass_runs_in_chunks_of_rows_with_transformers_numbers(target_case, monkeypatch):
    """A pass longer than CHUNK_ROWS runs chunk by chunk (each chunk's mask [chunk, keys], never [T, T]):
    logits at the asked rows and every row's taps equal transformers' on ragged rows after a cached prefix."""
    from dflash_trt.model import target as target_module

    hf, ours = target_case
    monkeypatch.setattr(target_module, "CHUNK_ROWS", 7)
    shapes = []
    kind = type(ours.model.layers[0].self_attn)
    attend = kind.attend
    monkeypatch.setattr(kind, "attend", lambda self, q, k, v, seen: shapes.append(seen.shape) or attend(self, q, k, v, seen))
    ids = torch.randint(0, 256, (2, 41), generator=torch.Generator().manual_seed(4))
    ref = hf(ids, output_hidden_states=True)
    cache, slots, last = ours.new_cache(2, 64), torch.arange(2), ours.config.dims.num_layers - 1
    ours(ids[:, :3], torch.arange(3)[None].expand(2, -1), cache, slots)  # a cached prefix of 3
    positions = torch.arange(3, 41)[None].expand(2, -1)
    logit_rows = torch.tensor([[37], [20]])  # row 1 ends early (right padding after it)
    logits, taps = ours(ids[:, 3:], positions, cache, slots, tap_layers=(1, last), logit_rows=logit_rows)
    assert max(shape[2] for shape in shapes[1:]) == 7 and len(shapes) == (1 + 6) * ours.config.dims.num_layers
    want = torch.stack([ref.logits[0, 3 + 37], ref.logits[1, 3 + 20]])[:, None]
    assert (logits - want).abs().max() <= 1e-4
    expected = torch.cat([ref.hidden_states[2], ref.hidden_states[last + 1]], dim=-1)[:, 3:]
    assert (taps - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("rope", [YARN_ROPE, YARN_ROPE_FULL, {"rope_type": "yarn", "factor": 8.0, "mscale": 0.707,
                                                                "original_max_position_embeddings": 32,
                                                                "mscale_all_dim": 1.0}])
def test_yarn_frequencies_and_scaling_are_transformers_own(tmp_path, rope):
    """Inverse frequencies bit for bit and the cos / sin factor of transformers' yarn initialisation (fp32),
    `factor` defaulting to max_position_embeddings / original as transformers does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from dflash_trt.model.layers import rope_inv_freq

    hf = make_target(tmp_path, "qwen3", rope_scaling=rope, max_position_embeddings=64)
    want, scaling = ROPE_INIT_FUNCTIONS["yarn"](hf.config, "cpu")
    dims = read_target(tmp_path).config.dims
    assert torch.equal(rope_inv_freq(dims.rope, dims.head_dim), want)
    assert dims.rope.attention_scaling() == scaling
