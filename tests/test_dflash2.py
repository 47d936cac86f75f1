"""DFlash2 drafters (z-lab `DFlash2DraftModel`: grouped dynamic causal convolutions + a candidate selector)
against z-lab's own code (dflash==0.1.0, the same as z-lab/dflash @07ebd93) in fp32, and lossless decoding."""

import pytest
import torch
from tiny_models import make_dflash2_draft

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.drafts import propose
from dflash_trt.decoding.reference import speculative_generate


@pytest.fixture(scope="module")
def dflash2_pair(tiny_pair, tmp_path_factory):
    from dflash_trt.model.loader import load_pair

    target_dir, _, hf, _ = tiny_pair
    folder = tmp_path_factory.mktemp("dflash2")
    oracle = make_dflash2_draft(folder, hf.config, num_layers=2, block_size=8)
    return load_pair(target_dir, folder, dtype="fp32", device="cpu"), oracle, hf


def _features(hf, ids, layer_ids):
    with torch.no_grad():
        states = hf(ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1] for i in layer_ids], dim=-1)


def test_config_and_weights_read_as_zlab(dflash2_pair):
    pair, oracle, _ = dflash2_pair
    c = pair.draft.config
    assert (c.architecture, c.conv_kernel_size, c.conv_group_size, c.selector_rank, c.selector_top_k, c.block_size) == \
        ("dflash2", 2, 16, 8, 4, 8) == ("dflash2", 2, 16, 8, oracle.candidate_selector.top_k, oracle.block_size)


@pytest.mark.parametrize("width", [8, 3])
def test_forward_and_greedy_drafts_match_zlab(dflash2_pair, width):
    pair, oracle, hf = dflash2_pair
    draft, lm_head = pair.draft, pair.target.lm_head
    ids = torch.randint(0, 255, (1, 17), generator=torch.Generator().manual_seed(width))
    target_hidden = _features(hf, ids, list(draft.config.target_layer_ids))
    block = torch.tensor([[11] + [draft.config.mask_token_id] * (width - 1)])
    positions = torch.arange(17 + width)[None]
    with torch.no_grad():
        ref = oracle(target_hidden=target_hidden, noise_embedding=hf.model.embed_tokens(block), position_ids=positions)
        ref_drafts = oracle.propose(ref[:, 1:], block[:, 0], hf.lm_head, 0.0)[0]
    cache, slots = draft.new_cache(1, 64), torch.arange(1)
    ours = draft(pair.target.embed(block), positions[:, 17:], cache, slots, context=(target_hidden, positions[:, :17], None))
    assert (ours - ref).abs().max() <= 1e-5
    assert torch.equal(propose(draft, ours[:, 1:], lm_head, positions[:, 17], anchor=block[:, 0]), ref_drafts)
    # the selector's walk is not the unary argmax (else the test would not see it)
    assert width < 4 or not torch.equal(ref_drafts, draft.logits(ours[:, 1:], lm_head).argmax(-1))


def test_greedy_decoding_matches_zlab_dflash_generate(dflash2_pair):
    """Same tokens and the same acceptance per step as z-lab's dflash_generate (its last block narrows too)."""
    import time

    from dflash import model as dflash_model

    from dflash_trt.decoding.requests import Request, StopCriteria

    dflash_model._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize()

    pair, oracle, hf = dflash2_pair
    for seed in range(3):
        prompt = torch.randint(0, 255, (1, 9), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            ref = dflash_model.dflash_generate(oracle, hf, prompt, max_new_tokens=21, stop_token_ids=None, temperature=0.0,
                                  return_stats=True)
        ours = speculative_generate(pair.target, pair.draft, [Request(tuple(prompt[0].tolist()),
                                                                      stop=StopCriteria(21))], 8)[0]
        assert ours.tokens == ref.output_ids[0, 9:].tolist()
        assert ours.acceptance_lengths == ref.acceptance_lengths


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_dflash2_decoding_is_lossless(dflash2_pair, make_requests, temperature):
    from dflash_trt.runtime.service import DFlashService, ServiceLimits

    pair = dflash2_pair[0]
    requests = make_requests(temperature, n=12, seed=int(temperature * 10) + 7)
    ar = autoregressive_generate(pair.target, requests)
    for block in (4, 8):
        spec = speculative_generate(pair.target, pair.draft, requests, block)
        assert [s.tokens for s in spec] == [a.tokens for a in ar]
    svc = DFlashService(pair, ServiceLimits(max_batch_size=4, max_seq_len=128, block_size=8))
    try:
        assert [g.tokens for g in svc.generate(requests)] == [a.tokens for a in ar]
    finally:
        svc.shutdown()


def test_the_tensorrt_llm_routes_refuse_dflash2_by_name(dflash2_pair, tiny_pair, tmp_path):
    import yaml

    from dflash_trt.backends.trtllm.build import plan_trtllm_build
    from dflash_trt.backends.trtllm.llmapi import from_build_config
    from dflash_trt.convert.pipeline import ConvertConfig, convert
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.errors import UnsupportedModelError

    draft_dir = dflash2_pair[0].draft_dir
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"name": "d2", "target": str(tiny_pair[0]), "draft": str(draft_dir),
                                    "backend": "trtllm", "runtime": {"device": "cuda", "max_batch_size": 4,
                                                                     "max_seq_len": 256}}))
    cfg = load_build_config(path)
    with pytest.raises(UnsupportedModelError, match="DFlash2DraftModel: the paired TensorRT-LLM engines have no DFlash2"):
        plan_trtllm_build(cfg, tmp_path / "b")
    with pytest.raises(UnsupportedModelError, match="DFlash2DraftModel: TensorRT-LLM has no DFlash2"):
        from_build_config(cfg, "sm90")
    with pytest.raises(UnsupportedModelError, match="checkpoint layout has no DFlash2 tensors"):
        convert(ConvertConfig(target=str(tiny_pair[0]), draft=str(draft_dir), out=str(tmp_path / "ckpt")))
