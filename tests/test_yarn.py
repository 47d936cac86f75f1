"""YaRN pairs past their original window: the drafter equals z-lab's reference, decoding equals AR (greedy and
sampled), conversion writes the keys TensorRT-LLM reads, and what its table cannot hold is refused by name."""

import json
import math

import pytest
import torch
from convert_helpers import run_convert
from tiny_models import make_draft, make_target

from dflash_trt.backends.torch.parallel import load_trtllm_pair
from dflash_trt.checkpoint.configs import RopeConfig, parse_rope
from dflash_trt.checkpoint.draft_writer import draft_config_for_target, draft_config_json
from dflash_trt.checkpoint.hf import read_target
from dflash_trt.checkpoint.json_fields import Fields
from dflash_trt.checkpoint.trtllm_config import read_trtllm_config
from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.errors import UnsupportedModelError
from dflash_trt.model.layers import Rotary
from dflash_trt.model.loader import load_pair
from dflash_trt.runtime.local import generate

ORIGINAL = 32  # the window the pair was "trained" at; every test runs past it
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def yarn_pair(tmp_path_factory):
    """A Qwen3 target with 128 yarn positions (4 x 32) and a drafter carrying the same rope."""
    root = tmp_path_factory.mktemp("yarn")
    hf = make_target(root / "target", "qwen3", seed=5, max_position_embeddings=4 * ORIGINAL, rope_scaling=YARN)
    oracle = make_draft(root / "draft", hf.config, rope_scaling=YARN)
    return root / "target", root / "draft", hf, oracle


def test_the_drafter_equals_zlab_past_the_original_window(yarn_pair):
    dflash_model = pytest.importorskip("dflash.model")
    target_dir, draft_dir, hf, oracle = yarn_pair
    pair = load_pair(target_dir, draft_dir, dtype="fp32", device="cpu")
    assert pair.draft.rotary.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1)
    n = 3 * ORIGINAL
    ids = torch.randint(0, 255, (1, n), generator=torch.Generator().manual_seed(0))
    out = hf(ids, output_hidden_states=True)
    target_hidden = dflash_model.extract_context_feature(out.hidden_states, list(pair.draft.config.target_layer_ids))
    block = torch.tensor([[7] + [pair.draft.config.mask_token_id] * 7])
    positions = torch.arange(n + 8)[None]
    ref = oracle(target_hidden=target_hidden, noise_embedding=hf.model.embed_tokens(block), position_ids=positions)
    cache, slots = pair.draft.new_cache(1, n + 8), torch.arange(1)
    pair.draft.append_context(target_hidden, positions[:, :n], cache, slots)
    cache.advance(slots, n)
    ours = pair.draft(pair.target.embed(block), positions[:, n:], cache, slots)
    assert (ours - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoding_past_the_original_window_is_lossless(yarn_pair, temperature):
    """Prompts that start inside the original window and end far past it: the reference loop and the engine
    give AR's tokens, and greedy drafting agrees with z-lab's dflash_generate step for step."""
    target_dir, draft_dir, hf, oracle = yarn_pair
    pair = load_pair(target_dir, draft_dir, dtype="fp32", device="cpu")
    requests = [Request(tuple(range(3, 3 + length)), SamplingParams(temperature, seed=seed), StopCriteria(48))
                for seed, length in enumerate((9, 40, 70))]
    ar = autoregressive_generate(pair.target, requests)
    spec = speculative_generate(pair.target, pair.draft, requests, 8)
    engine, _ = generate(pair, requests, 8)
    for a, s, e in zip(ar, spec, engine):
        assert s.tokens == e.tokens == a.tokens
    assert max(len(r.prompt) + len(a.tokens) for r, a in zip(requests, ar)) > 3 * ORIGINAL
    if temperature == 0.0:
        dflash_model = pytest.importorskip("dflash.model")
        import time

        dflash_model._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize()
        prompt = torch.tensor([requests[2].prompt])
        stats = dflash_model.dflash_generate(oracle, hf, prompt, 48, None, 0.0, block_size=8, return_stats=True)
        assert stats.output_ids[0, prompt.shape[1]:].tolist() == spec[2].tokens
        assert stats.acceptance_lengths == spec[2].acceptance_lengths


def trtllm_yarn_table(config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [max_position_embeddings, rotary_embedding_dim] as TensorRT-LLM 1.2.1's engine builds them from a
    checkpoint config: Attention.create_attention_const_params reads rotary_scaling's type ('type' first), factor
    (default 1.0), original_max_position_embeddings (4096), beta_fast (32), beta_slow (1), mscale (1.0),
    mscale_all_dim (0.0) and passes max_position_embeddings rows (tensorrt_llm/layers/attention.py);
    RopeEmbeddingUtils.create_sinusoidal_positions_yarn computes them in float32, integer ramp bounds clamped to
    [0, dim - 1], cos and sin times mscale ratio (tensorrt_llm/functional.py)."""
    s, dim, base = config["rotary_scaling"], config["rotary_embedding_dim"], config["rotary_base"]
    assert s.get("type", s.get("rope_type")) == "yarn"
    factor, original = s.get("factor", 1.0), s.get("original_max_position_embeddings", 4096)

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(s.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(s.get("beta_slow", 1))), dim - 1)
    high = high + 0.001 if low == high else high

    def get_mscale(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    mask = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    inv_freq = inter * (1 - mask) + extra * mask
    angles = torch.einsum("i,j -> ij", torch.arange(config["max_position_embeddings"], dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    mscale = float(get_mscale(factor, s.get("mscale", 1.0)) / get_mscale(factor, s.get("mscale_all_dim", 0.0)))
    return torch.cos(emb) * mscale, torch.sin(emb) * mscale


@pytest.mark.parametrize("rope", [YARN, YARN | {"beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.8,
                                                "mscale_all_dim": 0.6},
                                  YARN | {"mscale": 0.707}, YARN | {"attention_factor": 0.1 * math.log(4.0) + 1}])
def test_the_converted_config_gives_trtllm_our_rope_table(tmp_path, rope):
    """The engine's yarn table, computed from the written config.json as TensorRT-LLM does, equals the
    runtime's (which equals transformers'), on every row; a lone mscale (transformers ignores it) is written
    as TensorRT-LLM's no-op value; reading the checkpoint back gives the same rope."""
    hf = make_target(tmp_path / "t", "qwen3", max_position_embeddings=4 * ORIGINAL, rope_scaling=rope)
    make_draft(tmp_path / "d", hf.config)
    run_convert(tmp_path / "t", tmp_path / "d", tmp_path / "out")
    config = json.loads((tmp_path / "out" / "target" / "config.json").read_text())
    assert config["rotary_scaling"]["original_max_position_embeddings"] == ORIGINAL  # TensorRT-LLM's default: 4096
    assert "attention_factor" not in config["rotary_scaling"] and "truncate" not in config["rotary_scaling"]
    cos, sin = trtllm_yarn_table(config)
    dims = read_target(tmp_path / "t").config.dims
    ours = Rotary(dims.rope, dims.head_dim)._table(4 * ORIGINAL, torch.float32)
    assert torch.allclose(cos, ours[0][: 4 * ORIGINAL], rtol=0, atol=1e-6)
    assert torch.allclose(sin, ours[1][: 4 * ORIGINAL], rtol=0, atol=1e-6)
    back = read_trtllm_config(tmp_path / "out" / "target" / "config.json").model.dims.rope
    assert torch.equal(Rotary(back, dims.head_dim)._table(4 * ORIGINAL, torch.float32)[0][: 4 * ORIGINAL],
                       ours[0][: 4 * ORIGINAL])
    pair = load_trtllm_pair(tmp_path / "out" / "target", tmp_path / "out" / "draft", dtype="fp32", device="cpu")
    ids = torch.randint(0, 256, (1, 3 * ORIGINAL), generator=torch.Generator().manual_seed(1))
    logits, _ = pair.target(ids, torch.arange(3 * ORIGINAL)[None], pair.target.new_cache(1, 128), torch.arange(1))
    assert (logits - hf(ids).logits).abs().max() <= 1e-4


@pytest.mark.parametrize("extra", [{"truncate": False}, {"attention_factor": 0.9}])
def test_conversion_refuses_a_yarn_the_engine_table_cannot_reproduce(tmp_path, extra):
    hf = make_target(tmp_path / "t", "qwen3", max_position_embeddings=4 * ORIGINAL, rope_scaling=YARN | extra)
    make_draft(tmp_path / "d", hf.config)
    written = json.loads((tmp_path / "t" / "config.json").read_text())
    key = "rope_parameters" if "rope_parameters" in written else "rope_scaling"  # as this transformers saves it
    assert written[key][next(iter(extra))] == next(iter(extra.values()))
    with pytest.raises(UnsupportedModelError, match=f"t/config.json: field '{key}.{next(iter(extra))}'"):
        run_convert(tmp_path / "t", tmp_path / "d", tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_trtllm_checkpoint_reads_back_as_its_engine_computes(tmp_path):
    """A checkpoint config.json TensorRT-LLM would read differently from transformers (a lone mscale; keys left
    to TensorRT-LLM's defaults) runs in the torch backend with the engine's table, not transformers'."""
    hf = make_target(tmp_path / "t", "qwen3", max_position_embeddings=4 * ORIGINAL, rope_scaling=YARN)
    make_draft(tmp_path / "d", hf.config)
    run_convert(tmp_path / "t", tmp_path / "d", tmp_path / "out")
    path = tmp_path / "out" / "target" / "config.json"
    config = json.loads(path.read_text())
    config["rotary_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL,
                                "mscale": 0.707}  # no beta_*, no mscale_all_dim: the engine's defaults
    path.write_text(json.dumps(config))
    rope = read_trtllm_config(path).model.dims.rope
    cos, _ = trtllm_yarn_table(config)
    assert rope.attention_scaling() == pytest.approx(0.1 * 0.707 * math.log(4.0) + 1)  # transformers: 0.1 ln 4 + 1
    assert torch.allclose(Rotary(rope, config["rotary_embedding_dim"])._table(4 * ORIGINAL, torch.float32)[0][:128],
                          cos, rtol=0, atol=1e-6)


def test_a_trtllm_build_past_the_yarn_table_is_refused(tmp_path, yarn_pair):
    import yaml

    from dflash_trt.backends.trtllm.build import plan_trtllm_build
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.errors import ConfigError

    def config(max_seq_len):
        path = tmp_path / f"cfg{max_seq_len}.yaml"
        path.write_text(yaml.safe_dump({"name": "yarn", "target": str(yarn_pair[0]), "draft": str(yarn_pair[1]),
                                        "backend": "trtllm", "block_size": 8,
                                        "runtime": {"device": "cuda", "max_batch_size": 2,
                                                    "max_seq_len": max_seq_len}}))
        return load_build_config(path)

    with pytest.raises(ConfigError, match=r"field 'runtime.max_seq_len': 128 .* expected <= 118"):
        plan_trtllm_build(config(128), tmp_path / "b")
    assert plan_trtllm_build(config(118), tmp_path / "c").draft_spec.capacity == 118 + 8 + 1


def test_a_drafter_trained_for_a_yarn_target_is_written_with_its_rope(tmp_path, yarn_pair):
    """The drafter config written for training reads back with its target's yarn (not plain RoPE)."""
    target = read_target(yarn_pair[0]).config
    draft = draft_config_for_target(target, num_layers=1, block_size=8, mask_token_id=255, target_layer_ids=(2,))
    config = draft_config_json(draft)
    assert config["rope_parameters"]["rope_type"] == "yarn"
    back = parse_rope(Fields(config, tmp_path / "config.json"))
    assert back == target.dims.rope and back != RopeConfig(theta=back.theta)
