"""Bit-exact by construction on the CPU backend (fp32, and bf16 / fp16 held as fp32): every logit row of the
target is computed the same way whatever the pass — prefill, AR decode, verify, lazy verify, a batch of any
size — so the engine's greedy and seeded DFlash equal its own autoregressive decoding even on a target whose
best logits nearly tie, and a request decodes the same alone or in a batch."""

import random

import pytest
import torch
from tiny_models import make_draft, make_target

from dflash_trt.backends.cpu import target as cpu_target
from dflash_trt.backends.cpu.target import head_logits
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.runtime.local import generate


def _dflash(pair, requests, block):
    return [r.tokens for r in generate(pair, requests, block, width_policy="schedule")[0]]


def _ar(pair, requests):
    return [r.tokens for r in generate(pair, requests, autoregressive=True)[0]]


@pytest.fixture(scope="module")
def near_tie_dir(tmp_path_factory):
    """A target whose lm_head rows come in near-duplicate pairs (~1e-7 apart relative): its two best
    logits are often within the rounding of a different summation order."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("near-tie")
    hf = make_target(root / "target", seed=4)
    make_draft(root / "draft", hf.config, seed=5)
    path = root / "target" / "model.safetensors"
    state = load_file(str(path))
    head = state["lm_head.weight"]
    half = head.shape[0] // 2
    g = torch.Generator().manual_seed(0)
    head[half:] = head[:half] * (1 + 1e-7 * torch.randn(half, head.shape[1], generator=g))
    save_file(state, str(path))
    return root


@pytest.fixture(scope="module", params=["fp32", "bf16", "fp16"])
def near_tie_pair(near_tie_dir, request):
    from dflash_trt.model.loader import load_pair

    return load_pair(near_tie_dir / "target", near_tie_dir / "draft", dtype=request.param, device="cpu")


def test_a_logit_row_is_the_same_bits_in_a_pass_of_any_size(near_tie_pair):
    lm_head = near_tie_pair.target.lm_head
    rows = torch.randn(300, lm_head.weight.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():  # the decode loops run so (C++ calls need no autograd)
        whole = head_logits(lm_head, rows)
        parts = {(lo, hi): head_logits(lm_head, rows[lo:hi]) for lo, hi in ((0, 1), (5, 7), (10, 14), (20, 25), (40, 56), (100, 229), (0, 300))}
    for (lo, hi), part in parts.items():
        assert torch.equal(part, whole[lo:hi]), (lo, hi)


def _prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(255) for _ in range(rng.randint(3, 30))) for _ in range(n)]


def test_greedy_speculative_equals_ar_on_a_near_tie_target(near_tie_pair):
    pair = near_tie_pair
    requests = [Request(p, stop=StopCriteria(40)) for p in _prompts(20)]
    alone = [_ar(pair, [r])[0] for r in requests]
    for block in (4, 16):
        spec = [_dflash(pair, [r], block)[0] for r in requests]
        assert spec == alone, f"block {block}: {sum(s != a for s, a in zip(spec, alone))} of 20 prompts differ"
    assert _dflash(pair, requests, 8) == alone
    assert [r.tokens for r in generate(pair, requests, 16, min_confidence=0.1)[0]] == alone  # measured widths, cut


def test_ar_alone_equals_ar_in_a_batch(near_tie_pair):
    pair = near_tie_pair
    requests = [Request(p, stop=StopCriteria(40)) for p in _prompts(9, seed=2)]
    alone = [_ar(pair, [r])[0] for r in requests]
    for size in (3, 9):
        assert _ar(pair, requests[:size]) == alone[:size]


def test_a_long_prompt_prefills_to_the_bits_of_its_decode_steps(near_tie_pair):
    """A 300-token prefill is more rows than one C++ pass takes: it runs in pieces, and every row's logits
    and taps (the drafter's context: a middle layer and the last, normed one) are those of feeding the
    tokens one at a time, or 16 at a time (a verify pass's rows)."""
    target = near_tie_pair.target
    taps = (1, len(target.model.layers) - 1)
    tokens = torch.randint(0, 255, (1, 300), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(300)[None]
    with torch.inference_mode():
        whole, whole_taps = cpu_target.forward(target, tokens, positions, target.new_cache(1, 320), torch.arange(1), taps)
        for rows in (1, 16):
            cache, steps, step_taps = target.new_cache(1, 320), [], []
            for i in range(0, 288, rows):
                logits, hidden = cpu_target.forward(target, tokens[:, i:i + rows], positions[:, i:i + rows], cache,
                                                    torch.arange(1), taps)
                cache.advance(torch.arange(1), rows)
                steps.append(logits[0])
                step_taps.append(hidden[0])
            assert torch.equal(whole[0, :288], torch.cat(steps)), rows
            assert torch.equal(whole_taps[0, :288], torch.cat(step_taps)), rows
    assert whole_taps.shape == (1, 300, 2 * target.lm_head.weight.shape[1])


def test_seeded_sampling_is_bit_exact_in_every_dtype(near_tie_pair):
    """Sampled rows (T 1.0, per-request seeds), a ragged batch, the synchronous engine and the threaded
    service: the engine's AR tokens of each request alone."""
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.runtime.service import DFlashService, ServiceLimits

    pair = near_tie_pair
    requests = [Request(p, SamplingParams(1.0, 0, 1.0, seed=3 + i), StopCriteria(60)) for i, p in
                enumerate(_prompts(6, seed=4))]
    alone = [_ar(pair, [r])[0] for r in requests]
    assert _dflash(pair, requests, 8) == alone
    svc = DFlashService(pair, ServiceLimits(max_batch_size=3, max_seq_len=128, block_size=8))
    try:
        assert [g.tokens for g in svc.generate(requests)] == alone
    finally:
        svc.shutdown()


def test_bf16_weights_are_the_checkpoints_values_rounded(near_tie_dir):
    """bf16 / fp16 on CPU: each weight is the checkpoint's value rounded to that dtype (held exactly in fp32)."""
    from safetensors.torch import load_file

    from dflash_trt.model.loader import load_pair

    stored = load_file(str(near_tie_dir / "target" / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        target = load_pair(near_tie_dir / "target", None, dtype=dtype, device="cpu").target
        held = target.model.layers[0].mlp.down_proj.weight
        assert held.dtype == torch.float32 and torch.equal(held, stored.to(torch_dtype).float())


@pytest.mark.integration
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_served_bundles_decode_bit_exactly_in_half_precision(near_tie_dir, tmp_path, dtype):
    """A bf16 / fp16 CPU bundle of the near-tie pair on the real tritonserver: greedy and seeded answers,
    four at a time, are local AR's tokens in that dtype."""
    from concurrent.futures import ThreadPoolExecutor

    import yaml

    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.model.loader import load_pair
    from dflash_trt.runtime.build import build
    from dflash_trt.triton.client import grpc_generate, request_inputs
    from dflash_trt.triton.repository import publish
    from dflash_trt.triton.server import TritonServer

    config = {"name": f"near-tie-{dtype}", "target": str(near_tie_dir / "target"), "draft": str(near_tie_dir / "draft"),
              "backend": "torch", "dtype": dtype, "block_size": 8,
              "runtime": {"device": "cpu", "max_batch_size": 4, "max_seq_len": 128},
              "golden": {"prompts": [{"token_ids": [5, 17, 42, 9]}], "max_new_tokens": 16},
              "output": str(tmp_path / "bundle"), "repository": str(tmp_path / "repo")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
    bundle, _, _ = build(load_build_config(tmp_path / "cfg.yaml"), log=lambda m: None)
    pair = load_pair(near_tie_dir / "target", None, dtype=dtype, device="cpu")
    prompts = _prompts(8, seed=6)
    params = [SamplingParams(0.0 if i % 2 else 1.0, 0, 1.0, seed=i) for i in range(8)]
    expected = [_ar(pair, [Request(p, s, StopCriteria(32))])[0] for p, s in zip(prompts, params)]
    server = TritonServer(publish(bundle, tmp_path / "repo"), log_path=tmp_path / "server.log").start(timeout=180)
    try:
        def ask(i):
            inputs = request_inputs(None, list(prompts[i]), 32, temperature=params[i].temperature, seed=i,
                                    ignore_eos=True)
            return grpc_generate(server.grpc_url, inputs).token_ids

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, range(8))) == expected
    finally:
        server.stop()


@pytest.mark.parametrize("dtype,expected_format", [("bf16", 1), ("fp16", 2)])
def test_half_weights_stream_as_half_panels_with_the_same_bits(near_tie_dir, monkeypatch, dtype, expected_format):
    """A bf16 / fp16 checkpoint's layers stream 16-bit panels (half the bytes of fp32), expanded exactly in
    the kernel: the logits are the fp32 panels' bit for bit; fp32 weights (neither) keep fp32 panels."""
    from dflash_trt.backends.cpu import layers as cpu_layers
    from dflash_trt.model.loader import load_pair

    tokens = torch.randint(0, 255, (2, 40), generator=torch.Generator().manual_seed(9))
    positions = torch.arange(40)[None].expand(2, -1)

    def logits(target):
        for layer in target.model.layers:
            layer.__dict__.pop("_cpu_plan", None)
        with torch.inference_mode():
            out, _ = cpu_target.forward(target, tokens, positions, target.new_cache(2, 64), torch.arange(2))
        return out, {layer.__dict__["_cpu_plan"].weight_format for layer in target.model.layers}

    half = load_pair(near_tie_dir / "target", None, dtype=dtype, device="cpu").target
    streamed, formats = logits(half)
    assert formats == {expected_format}
    monkeypatch.setattr(cpu_layers, "HALF_PANELS", False)
    expanded, formats = logits(half)
    assert formats == {0} and torch.equal(streamed, expanded)
    monkeypatch.setattr(cpu_layers, "HALF_PANELS", True)
    fp32 = load_pair(near_tie_dir / "target", None, dtype="fp32", device="cpu").target
    assert logits(fp32)[1] == {0}
