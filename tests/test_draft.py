"""Our drafter, reference loop and engine equal z-lab's reference (PyPI dflash==0.1.0) in fp32."""

import time

import pytest
import torch
from scripted import ScriptedDraft, script_oracle

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.decoding.requests import Request, StopCriteria

dflash_model = pytest.importorskip("dflash.model")


def _oracle_features(hf, ids, layer_ids):
    out = hf(ids, output_hidden_states=True)
    return dflash_model.extract_context_feature(out.hidden_states, layer_ids)


def test_draft_hidden_and_logits_match_reference(tiny_pair, loaded_tiny_pair):
    _, _, hf, oracle = tiny_pair
    target, draft = loaded_tiny_pair.target, loaded_tiny_pair.draft
    ids = torch.randint(0, 255, (1, 23), generator=torch.Generator().manual_seed(0))
    target_hidden = _oracle_features(hf, ids, list(draft.config.target_layer_ids))
    block = torch.tensor([[7] + [draft.config.mask_token_id] * 7])
    noise = hf.model.embed_tokens(block)
    positions = torch.arange(31)[None]
    ref = oracle(target_hidden=target_hidden, noise_embedding=noise, position_ids=positions)
    cache, slots = draft.new_cache(1, 64), torch.arange(1)
    draft.append_context(target_hidden, positions[:, :23], cache, slots)
    cache.advance(slots, 23)
    ours = draft(target.embed(block), positions[:, 23:], cache, slots)
    assert (ours - ref).abs().max() <= 1e-5
    ref_logits = oracle.compute_logits(ref, hf.lm_head)
    assert (draft.logits(ours, target.lm_head) - ref_logits).abs().max() <= 1e-4


def _oracle_generate(oracle, hf, prompt, max_new, block_size):
    dflash_model._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize()
    ids = torch.tensor([prompt])
    stats = dflash_model.dflash_generate(oracle, hf, ids, max_new, None, 0.0, block_size=block_size, return_stats=True)
    return stats.output_ids[0, len(prompt):].tolist(), stats.acceptance_lengths


@pytest.mark.parametrize("block_size", [2, 5, 8])
def test_greedy_decode_matches_dflash_generate_random_draft(tiny_pair, loaded_tiny_pair, block_size):
    _, _, hf, oracle = tiny_pair
    prompt = list(range(3, 3 + 17))
    tokens, lengths = _oracle_generate(oracle, hf, prompt, 40, block_size)
    request = Request(tuple(prompt), stop=StopCriteria(40))
    ours = speculative_generate(loaded_tiny_pair.target, loaded_tiny_pair.draft, [request], block_size)[0]
    assert ours.tokens == tokens
    assert ours.acceptance_lengths == lengths
    from dflash_trt.runtime.local import generate  # the engine (CPU backend), full blocks: the same steps

    (engine,), _ = generate(loaded_tiny_pair, [request], block_size, width_policy="schedule")
    assert engine.tokens == tokens and engine.acceptance_lengths == lengths


@pytest.mark.parametrize("corrupt", [0.0, 0.2, 0.5])
def test_greedy_decode_matches_dflash_generate_with_acceptance(tiny_pair, loaded_tiny_pair, tmp_path, corrupt):
    """Both drafters are scripted identically, so both loops accept 0..K drafts per block."""
    from tiny_models import make_draft

    target_dir, draft_dir, hf, _ = tiny_pair
    oracle = make_draft(tmp_path / "d", hf.config)  # a fresh instance to patch
    prompt = [11, 5, 250, 7, 7, 1]
    request = Request(tuple(prompt), stop=StopCriteria(48))
    ar = autoregressive_generate(loaded_tiny_pair.target, [request])[0]
    script = prompt + ar.tokens
    tokens, lengths = _oracle_generate(script_oracle(oracle, script, corrupt), hf, prompt, 48, 8)
    draft = ScriptedDraft(loaded_tiny_pair.draft, [script], corrupt)
    ours = speculative_generate(loaded_tiny_pair.target, draft, [request], 8, propose=draft.propose)[0]
    assert tokens == ar.tokens and ours.tokens == ar.tokens
    assert ours.acceptance_lengths == lengths
    if corrupt == 0.0:
        assert max(lengths) == 8


@pytest.mark.parametrize("use_window", [True, False])
def test_sliding_window_draft_matches_reference(tiny_pair, tmp_path, use_window):
    """z-lab `layer_types`: a causal sliding-window layer beside a full-attention layer. As in HF's
    Qwen3Config, `sliding_window` counts only with `use_sliding_window` (else: causal, no window)."""
    from tiny_models import make_draft

    from dflash_trt.model.loader import load_pair

    target_dir, _, hf, _ = tiny_pair
    oracle = make_draft(tmp_path / "d", hf.config, layer_types=["sliding_attention", "full_attention"],
                        sliding_window=6, use_sliding_window=use_window)
    pair = load_pair(target_dir, tmp_path / "d", dtype="fp32", device="cpu")
    draft = pair.draft
    assert draft.layers[0].is_causal and not draft.layers[1].is_causal
    assert draft.layers[0].window == (6 if use_window else None) and draft.layers[1].window is None
    ids = torch.randint(0, 255, (1, 23), generator=torch.Generator().manual_seed(1))
    target_hidden = _oracle_features(hf, ids, list(draft.config.target_layer_ids))
    block = torch.tensor([[9] + [draft.config.mask_token_id] * 7])
    positions = torch.arange(31)[None]
    ref = oracle(target_hidden=target_hidden, noise_embedding=hf.model.embed_tokens(block), position_ids=positions)
    cache, slots = draft.new_cache(1, 64), torch.arange(1)
    ours = draft(pair.target.embed(block), positions[:, 23:], cache, slots,
                 context=(target_hidden, positions[:, :23], None))
    assert (ours - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_context_folded_into_draft_pass_equals_append_then_draft(tiny_pair, tmp_path, layer_types):
    """Ragged rows: `forward(context=...)` == `append_context` then `forward`, hidden and cache alike."""
    from tiny_models import make_draft

    from dflash_trt.model.loader import load_pair

    target_dir, draft_dir, hf, _ = tiny_pair
    if layer_types is not None:
        make_draft(tmp_path / "d", hf.config, layer_types=layer_types, sliding_window=5, use_sliding_window=True)
        draft_dir = tmp_path / "d"
    pair = load_pair(target_dir, draft_dir, dtype="fp32", device="cpu")
    target, draft = pair.target, pair.draft
    g = torch.Generator().manual_seed(3)
    n_ctx = draft.config.target_layer_ids.__len__() * target.config.dims.hidden_size
    for batch in (1, 3):
        slots = torch.tensor([2, 0, 1][:batch])
        caches = [draft.new_cache(3, 64) for _ in range(2)]
        prompt_len = torch.tensor([11, 7, 14][:batch])
        prompt = torch.randn(batch, 14, n_ctx, generator=g)
        positions = torch.arange(14)[None].expand(batch, -1)
        for cache in caches:  # the prompt's context, stored alike in both caches
            draft.append_context(prompt, positions, cache, slots, positions < prompt_len[:, None])
        # a verified block of 6 rows at each row's start, committing 1..6 of them
        taps = torch.randn(batch, 6, n_ctx, generator=g)
        ctx_positions = prompt_len[:, None] + torch.arange(6)[None]
        committed = torch.tensor([3, 6, 1][:batch])
        valid = torch.arange(6)[None] < committed[:, None]
        start = prompt_len + committed
        block = torch.randint(0, 255, (batch, 5), generator=g)
        block_positions = start[:, None] + torch.arange(5)[None]
        noise = target.embed(block)
        draft.append_context(taps, ctx_positions, caches[0], slots, valid)
        separate = draft(noise, block_positions, caches[0], slots)
        folded = draft(noise, block_positions, caches[1], slots, context=(taps, ctx_positions, valid))
        assert (separate - folded).abs().max() <= 1e-5
        for row, slot in enumerate(slots.tolist()):  # committed context identical in both caches
            n = int(start[row])
            assert torch.allclose(caches[0].k[:, slot, :, :n], caches[1].k[:, slot, :, :n], atol=1e-6)
            assert torch.allclose(caches[0].v[:, slot, :, :n], caches[1].v[:, slot, :, :n], atol=1e-6)


def test_window_layers_derived_as_hf_without_layer_types(tiny_pair, tmp_path):
    """use_sliding_window + max_window_layers and no layer_types: HF's Qwen3Config (z-lab's loader) makes the
    layers from max_window_layers on sliding; ours reads the same and the forward matches z-lab's."""
    import json

    from tiny_models import make_draft

    from dflash_trt.model.loader import load_pair

    target_dir, _, hf, _ = tiny_pair
    oracle = make_draft(tmp_path / "d", hf.config, layer_types=None, sliding_window=5, use_sliding_window=True,
                        max_window_layers=1)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    del config["layer_types"]
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    assert list(oracle.config.layer_types) == ["full_attention", "sliding_attention"]
    pair = load_pair(target_dir, tmp_path / "d", dtype="fp32", device="cpu")
    assert pair.draft.config.layer_types == ("full_attention", "sliding_attention")
    assert [layer.window for layer in pair.draft.layers] == [None, 5]
    ids = torch.randint(0, 255, (1, 19), generator=torch.Generator().manual_seed(2))
    target_hidden = _oracle_features(hf, ids, list(pair.draft.config.target_layer_ids))
    block = torch.tensor([[4] + [pair.draft.config.mask_token_id] * 7])
    positions = torch.arange(27)[None]
    ref = oracle(target_hidden=target_hidden, noise_embedding=hf.model.embed_tokens(block), position_ids=positions)
    ours = pair.draft(pair.target.embed(block), positions[:, 19:], pair.draft.new_cache(1, 64), torch.arange(1),
                      context=(target_hidden, positions[:, :19], None))
    assert (ours - ref).abs().max() <= 1e-5


def test_newer_zlab_config_layout_reads_as_zlab_reads_it(tiny_pair, tmp_path):
    """The newer z-lab layout (z-lab/Qwen3.5-35B-A3B-DFlash, tests/fixtures/dflash2-config.json @0a7587c):
    block size inside dflash_config, rope_parameters, explicit sliding layer_types, top-level is_causal."""
    import json

    from tiny_models import make_draft

    from dflash_trt.model.loader import load_pair

    target_dir, _, hf, _ = tiny_pair
    make_draft(tmp_path / "d", hf.config, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
               use_sliding_window=True, max_window_layers=2, is_causal=False)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    config["dflash_config"]["block_size"] = config.pop("block_size") * 2
    config["rope_parameters"] = {"rope_theta": config.pop("rope_theta") * 3, "rope_type": "default"}
    (tmp_path / "d" / "config.json").write_text(json.dumps(config))
    oracle = __import__("tiny_models").oracle_draft(config)
    oracle.load_state_dict(__import__("safetensors.torch", fromlist=["load_file"]).load_file(
        str(tmp_path / "d" / "model.safetensors")))
    assert oracle.block_size == 16
    pair = load_pair(target_dir, tmp_path / "d", dtype="fp32", device="cpu")
    draft = pair.draft
    assert draft.config.block_size == 16 and draft.config.dims.rope.theta == 30000.0
    assert [layer.is_causal for layer in draft.layers] == [False, False]  # top-level is_causal: false
    assert [layer.window for layer in draft.layers] == [4, None]
    ids = torch.randint(0, 255, (1, 21), generator=torch.Generator().manual_seed(3))
    target_hidden = _oracle_features(hf, ids, list(draft.config.target_layer_ids))
    block = torch.tensor([[8] + [draft.config.mask_token_id] * 15])
    positions = torch.arange(37)[None]
    ref = oracle(target_hidden=target_hidden, noise_embedding=hf.model.embed_tokens(block), position_ids=positions)
    ours = draft(pair.target.embed(block), positions[:, 21:], draft.new_cache(1, 64), torch.arange(1),
                 context=(target_hidden, positions[:, :21], None))
    assert (ours - ref).abs().max() <= 1e-5
