"""The CPU backend's passes (backends/cpu: the C++ decoder layer, the heads' panels, the one-call draft step)
equal the models' torch forwards, keep rows independent, and step aside for everything they do not implement."""

import pytest
import torch
from tiny_models import make_target
from torch import nn
from torch.nn import functional as F

from dflash_trt.backends.cpu import draft as cpu_draft
from dflash_trt.backends.cpu import layers as cpu_layers
from dflash_trt.backends.cpu import ops as cpu_ops
from dflash_trt.backends.cpu import target as cpu_target
from dflash_trt.checkpoint.hf import read_target
from dflash_trt.kernels import select
from dflash_trt.model.loader import load_target

TAPS = (0, 2, 3)


@pytest.fixture(scope="module", params=["qwen3_gqa", "llama_mha_odd_dims"])
def target(request, tmp_path_factory):
    overrides = {} if request.param == "qwen3_gqa" else {"num_key_value_heads": 4, "intermediate_size": 100}
    family = "qwen3" if request.param == "qwen3_gqa" else "llama"
    folder = tmp_path_factory.mktemp(request.param)
    make_target(folder, family, seed=5, **overrides)
    return load_target(read_target(folder)).fuse()


@pytest.fixture
def torch_path(monkeypatch):
    """Run a function with the C++ library switched off: the CPU passes fall back to the models' torch forwards."""

    def run(fn):
        with monkeypatch.context() as m:
            m.setattr(cpu_ops, "library", lambda: None)
            return fn()

    return run


def decode_in_blocks(model, tokens, prefill, width):
    """Prefill `prefill` tokens, then the rest in blocks of `width` rows -> logits, taps of those rows."""
    cache = model.new_cache(1, 96)
    slots = torch.tensor([0])
    with torch.inference_mode():
        cpu_target.forward(model, tokens[:, :prefill], torch.arange(prefill)[None], cache, slots)
        logits, taps, pos = [], [], prefill
        while pos < tokens.shape[1]:
            n = min(width, tokens.shape[1] - pos)
            out, hidden = cpu_target.forward(model, tokens[:, pos : pos + n], torch.arange(pos, pos + n)[None], cache,
                                             slots, TAPS)
            logits.append(out)
            taps.append(hidden)
            pos += n
    return torch.cat(logits, 1), torch.cat(taps, 1)


def test_library_builds_here():
    assert cpu_ops.library() is not None, "g++ is needed on CI machines (the verify twin needs it too)"


def test_target_cpu_layers_equal_the_torch_path(target, torch_path):
    tokens = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(0))
    want_logits, want_taps = torch_path(lambda: decode_in_blocks(target, tokens, 37, 5))
    assert cpu_layers.plans(target.model.layers) is not None
    for width in (1, 4, 9, 23):
        logits, taps = decode_in_blocks(target, tokens, 37, width)
        torch.testing.assert_close(logits, want_logits, rtol=0, atol=2e-5)
        torch.testing.assert_close(taps, want_taps, rtol=0, atol=2e-5)


def test_batched_rows_equal_the_torch_path_and_single_sequences(target, torch_path):
    """Three sequences in scattered cache slots at different positions, decoded together."""
    g = torch.Generator().manual_seed(4)
    lengths = [9, 30, 17]
    tokens = torch.randint(0, 256, (3, 50), generator=g)
    slots = torch.tensor([2, 0, 3])

    def run():
        cache = target.new_cache(4, 80)
        with torch.inference_mode():
            for row, n in enumerate(lengths):  # prefill each sequence alone
                cpu_target.forward(target, tokens[row : row + 1, :n], torch.arange(n)[None], cache, slots[row : row + 1])
            outs = []
            for step in range(4):  # then blocks of 5 rows for all three at once
                positions = torch.tensor(lengths)[:, None] + 5 * step + torch.arange(5)[None]
                block = tokens.gather(1, positions)
                outs.append(cpu_target.forward(target, block, positions, cache, slots, TAPS))
        return torch.cat([o[0] for o in outs], 1), torch.cat([o[1] for o in outs], 1)

    want_logits, want_taps = torch_path(run)
    logits, taps = run()
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=2e-5)
    torch.testing.assert_close(taps, want_taps, rtol=0, atol=2e-5)
    for row, n in enumerate(lengths):  # each row equals that sequence decoded alone, bit for bit
        alone = torch.cat([tokens[row : row + 1, :n], tokens[row : row + 1, n : n + 20]], 1)
        _, single = decode_in_blocks(target, alone, n, 5)
        assert torch.equal(taps[row], single[0])


def test_verify_block_rows_equal_one_token_decoding_bit_for_bit(target):
    tokens = torch.randint(0, 256, (1, 56), generator=torch.Generator().manual_seed(1))
    _, one_by_one = decode_in_blocks(target, tokens, 20, 1)
    for width in (3, 8, 16):
        _, block = decode_in_blocks(target, tokens, 20, width)
        assert torch.equal(block, one_by_one)  # the taps: every layer's output, row by row


def test_draft_cpu_layers_equal_the_torch_path(loaded_tiny_pair, torch_path):
    draft, target = loaded_tiny_pair.draft, loaded_tiny_pair.target
    g = torch.Generator().manual_seed(2)
    n_taps = len(draft.config.target_layer_ids) * target.config.dims.hidden_size
    target_hidden = torch.randn(1, 40, n_taps, generator=g)
    block = target.embed(torch.randint(0, 256, (1, 8), generator=g))

    def run():
        cache, slots = draft.new_cache(1, 64), torch.tensor([0])
        with torch.inference_mode():
            draft.append_context(target_hidden[:, :20], torch.arange(20)[None], cache, slots)
            first = cpu_draft.forward(draft, block, torch.arange(20, 28)[None], cache, slots)
            committed = torch.tensor([[True, True, True, False, False]])
            context = (target_hidden[:, 20:25], torch.arange(20, 25)[None], committed)
            second = cpu_draft.forward(draft, block, torch.arange(23, 31)[None], cache, slots, context)
        return first, second, cache.k[:, 0, :, :31].clone()

    want = torch_path(run)
    assert cpu_layers.plans(draft.layers) is not None and cpu_draft.full_attention(draft)
    for got, ref in zip(run(), want):
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("window", [3, 9])
def test_sliding_window_draft_layers_equal_the_torch_path(loaded_tiny_pair, torch_path, window):
    """A non-causal sliding-window drafter (z-lab's `sliding_attention` with `is_causal: false`): the C++
    layer reads only each query's window of keys and gives the torch mask's numbers, one sequence and a
    ragged batch; a window narrower than the block (3) cuts block keys too."""
    draft, target = loaded_tiny_pair.draft, loaded_tiny_pair.target

    def set_window(value):
        for layer in draft.layers:
            layer.window = value
            layer.__dict__.pop("_cpu_plan", None)  # a plan carries its layer's window

    set_window(window)
    try:
        check_window(draft, target, window, torch_path)
    finally:
        set_window(None)


def check_window(draft, target, window, torch_path):
    g = torch.Generator().manual_seed(7)
    n_taps = len(draft.config.target_layer_ids) * target.config.dims.hidden_size
    target_hidden = torch.randn(2, 40, n_taps, generator=g)
    block = target.embed(torch.randint(0, 256, (2, 8), generator=g))

    def run():
        cache, slots = draft.new_cache(3, 64), torch.tensor([2, 0])
        with torch.inference_mode():
            draft.append_context(target_hidden[:1, :20], torch.arange(20)[None], cache, slots[:1])
            draft.append_context(target_hidden[1:, :13], torch.arange(13)[None], cache, slots[1:])
            one = cpu_draft.forward(draft, block[:1], torch.arange(20, 28)[None], cache, slots[:1])
            context = (target_hidden[:, 20:25], torch.tensor([[20, 21, 22, 23, 24], [13, 14, 15, 16, 17]]),
                       torch.tensor([[True, True, False, False, False], [True, True, True, True, False]]))
            positions = torch.tensor([[22], [17]]) + torch.arange(8)[None]
            batch = cpu_draft.forward(draft, block, positions, cache, slots, context)
        return one, batch

    want = torch_path(run)
    assert cpu_draft.full_attention(draft) and cpu_layers.plans(draft.layers)[0].weights.window == window
    calls = []
    with pytest.MonkeyPatch.context() as m:
        run_layers = cpu_layers.run_layers
        m.setattr(cpu_layers, "run_layers", lambda *a, **k: calls.append(a[1].shape) or run_layers(*a, **k))
        got = run()
    assert len(calls) == 2  # both passes went through C++
    for out, ref in zip(got, want):
        torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)
    for layer in draft.layers:
        layer.window = None
    full = torch_path(run)
    assert not torch.allclose(full[1], want[1], atol=1e-3)  # the window changes the drafts' numbers


def test_last_layer_rows_in_stages_equal_the_whole_pass(target):
    """The last layer's rows in stages (layer_rows, the first stage writing every row's K/V): the same
    rows and K/V as a whole pass, bit for bit."""
    plans = cpu_layers.plans(target.model.layers)
    dims = target.config.dims
    tokens = torch.randint(0, 256, (1, 29), generator=torch.Generator().manual_seed(3))

    def pass_over_block(stages):
        cache, slots = target.new_cache(1, 64), torch.tensor([0])
        with torch.inference_mode():
            cpu_target.forward(target, tokens[:, :20], torch.arange(20)[None], cache, slots)
            x = target.embed(tokens[:, 20:]).reshape(9, -1).clone()
            cos, sin = target.rotary.rows(20, 9, x.dtype)
            args = (x, None, None, cache, slots, torch.tensor([20]), cos, sin)
            cpu_layers.run_layers(plans[:-1], *args, causal=True)
            for i, rows in enumerate(stages):
                cpu_layers.layer_rows(plans, len(plans) - 1, rows, *args, causal=True, write_kv=i == 0)
        return x, cache.k[:, 0, :, :29].clone(), cache.v[:, 0, :, :29].clone()

    whole = pass_over_block([(0, 9)])
    if dims.num_heads * dims.head_dim % 8:  # query heads not a whole number of panels: refused
        with pytest.raises(ValueError, match="rows 2..5"):
            pass_over_block([(2, 5)])
        return
    for stages in ([(2, 5), (5, 9), (0, 2)], [(8, 9), (0, 8)], [(0, 1), (1, 9)]):
        staged = pass_over_block(stages)
        for got, want in zip(staged, whole):
            assert torch.equal(got, want)
    x, _, _ = pass_over_block([(2, 5)])  # rows outside the range are left as the layer's input
    assert not torch.equal(x[:2], whole[0][:2]) and torch.equal(x[2:5], whole[0][2:5])


def _draft_block_both_ways(draft, target, seed: int, min_confidence: float, sampling=None) -> list[tuple]:
    """One random block (contexts whose scale ranges the drafter's confidence with `seed`) drafted by a
    whole pass then `propose`, and by `draft_block` (one C++ call): [(drafts, draft K, draft V)] in that order."""
    q = draft.config.block_size
    n_taps = len(draft.config.target_layer_ids) * target.config.dims.hidden_size
    g = torch.Generator().manual_seed(seed)
    target_hidden = torch.randn(1, 40, n_taps, generator=g) * (0.2 + seed / 4)  # a range of confidences
    bonus = torch.randint(0, 256, (1, 1), generator=g)
    block = target.embed(torch.cat([bonus, torch.full((1, q - 1), draft.config.mask_token_id)], 1))
    results = []
    for one_call in (False, True):
        cache, slots = draft.new_cache(2, 64), torch.tensor([1])
        with torch.inference_mode():
            draft.append_context(target_hidden[:, :20], torch.arange(20)[None], cache, slots)
            context = (target_hidden[:, 20:24], torch.arange(20, 24)[None], None) if seed % 3 else None
            start = 24 if seed % 3 else 20
            positions = torch.arange(start, start + q)[None]
            sample = select("cpu").sample_tokens
            if one_call:
                drafts = cpu_draft.draft_block(draft, block, positions, cache, slots, context, target.lm_head,
                                               min_confidence, sampling, None, sample, twin=True)
            else:
                hidden = cpu_draft.forward(draft, block, positions, cache, slots, context)
                drafts = cpu_draft.propose(draft, hidden[:, 1:], target.lm_head, positions[:, 0], sampling, None,
                                           min_confidence, sample)
        results.append((drafts, cache.k[:, 1, :, : 24 + q].clone(), cache.v[:, 1, :, : 24 + q].clone()))
    return results


@pytest.mark.parametrize("min_confidence", [0.0, 1e-300, 1e-9, 0.02, 0.3])
@pytest.mark.parametrize("draft_vocab", [None, 200])
def test_one_call_draft_block_equals_forward_then_propose(loaded_tiny_pair, monkeypatch, min_confidence, draft_vocab):
    """draft_block of one sequence is one C++ call (cpu_layers.DraftStep) whose last layer outputs the
    slots the confidence cut reads (the first 6, the rest only when those are trusted); drafts and
    draft K/V equal a whole pass followed by propose, with and without a draft vocabulary."""
    calls, last_rows = [], []
    step_call = cpu_layers.DraftStep.__call__

    def record(self, *a, **k):
        drafts = step_call(self, *a, **k)
        calls.append(drafts.numel())
        last_rows.append(self.last_rows)
        return drafts

    monkeypatch.setattr(cpu_layers.DraftStep, "__call__", record)
    draft, target = loaded_tiny_pair.draft, loaded_tiny_pair.target
    draft.use_vocab(None if draft_vocab is None else list(range(3, 3 + draft_vocab)), target.lm_head)
    q = draft.config.block_size
    try:
        for seed in range(12):
            results = _draft_block_both_ways(draft, target, seed, min_confidence)
            for got, want in zip(results[1], results[0]):
                assert torch.equal(got, want)
    finally:
        draft.use_vocab(None, target.lm_head)
    assert len(calls) == 12  # every draft_block was the one call
    if min_confidence == 0.0:  # no cut: the whole last layer, every slot proposed
        assert last_rows == [q] * 12 and calls == [q - 1] * 12
    else:  # slots 1..6 first; the rest of the layer only where those six were all trusted
        assert all(r == (q - 1 if n > 6 or (n == 6 and r == q - 1) else 6) for r, n in zip(last_rows, calls))
    if 0.0 < min_confidence < 1e-100:  # every slot trusted: the rest of the last layer ran each time
        assert last_rows == [q - 1] * 12
    if min_confidence >= 0.3:  # the cut falls within the first slots: the rest never ran
        assert last_rows.count(6) > 0


@pytest.mark.parametrize("min_confidence", [0.0, 0.02, 0.3])
@pytest.mark.parametrize("draft_vocab", [None, 100])
def test_one_call_sampled_draft_block_equals_forward_then_propose(loaded_tiny_pair, monkeypatch, min_confidence,
                                                                    draft_vocab):
    """A sampled sequence's draft_block is the same one C++ call: its coupled drafts (the twin's rule on
    the head's panels' logits, the request's noise), its cut (each draft's own probability) and its K/V
    equal a whole pass followed by propose, at every temperature, with top-k / top-p, with a draft
    vocabulary given in frequency order (kept in id order: the rule's noise and tie order)."""
    calls = []
    step_call = cpu_layers.DraftStep.__call__

    def record(self, *a, **k):
        drafts = step_call(self, *a, **k)
        calls.append(drafts.numel())
        return drafts

    monkeypatch.setattr(cpu_layers.DraftStep, "__call__", record)
    draft, target = loaded_tiny_pair.draft, loaded_tiny_pair.target
    ids = None if draft_vocab is None else torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(3))[:draft_vocab]
    draft.use_vocab(None if ids is None else ids.tolist(), target.lm_head)
    q = draft.config.block_size
    kept = []
    try:
        for seed in range(12):
            sampling = (torch.tensor([(0.7, 1.0, 1.5)[seed % 3]]), torch.tensor([(0, 40)[seed % 2]]),
                        torch.tensor([(1.0, 0.9)[seed // 2 % 2]]), torch.tensor([seed * 7919 - 5]))
            results = _draft_block_both_ways(draft, target, seed, min_confidence, sampling)
            for got, want in zip(results[1], results[0]):
                assert torch.equal(got, want), seed
            kept.append(results[0][0].numel())
            if ids is not None:
                assert set(results[0][0].flatten().tolist()) <= set(ids.tolist())
    finally:
        draft.use_vocab(None, target.lm_head)
    assert calls == kept  # every draft_block was the one call
    if min_confidence == 0.0:
        assert kept == [q - 1] * 12
    if min_confidence >= 0.3:
        assert min(kept) < q - 1  # the cut fell within the block


def test_sampled_trust_is_the_log_softmax_at_the_drafts():
    """cpu_ops.sampled_trust (what the C++ draft step's cut adds up, and confident_prefix on CPU) is
    log softmax(logits / T) at each row's column; a row with a NaN is -inf."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 333, generator=g) * 4
    logits[4, 17] = float("nan")
    columns = torch.randint(0, 333, (9,), generator=g)
    temperature = torch.tensor([0.3, 0.7, 1.0, 1.5, 1.0, 2.0, 0.05, 1.0, 1.0])
    with torch.inference_mode():
        got = cpu_ops.sampled_trust(logits, columns, temperature)
    want = torch.log_softmax(logits / temperature[:, None], dim=-1).gather(1, columns[:, None])[:, 0]
    assert got[4] == float("-inf")
    keep = torch.arange(9) != 4
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)


def test_batched_draft_with_ragged_contexts_equals_the_torch_path(loaded_tiny_pair, torch_path, monkeypatch):
    """Three rows in scattered slots, each with its own context length (valid prefixes) and block start."""
    calls = []
    run_layers = cpu_layers.run_layers
    monkeypatch.setattr(cpu_layers, "run_layers", lambda *a, **k: calls.append(a[1].shape) or run_layers(*a, **k))
    draft, target = loaded_tiny_pair.draft, loaded_tiny_pair.target
    g = torch.Generator().manual_seed(5)
    n_taps = len(draft.config.target_layer_ids) * target.config.dims.hidden_size
    slots, lengths = torch.tensor([1, 3, 0]), torch.tensor([12, 20, 7])
    target_hidden = torch.randn(3, 30, n_taps, generator=g)
    block = target.embed(torch.randint(0, 256, (3, 6), generator=g))
    committed = torch.tensor([3, 1, 4])

    def run():
        cache = draft.new_cache(4, 64)
        with torch.inference_mode():
            for row in range(3):
                n = int(lengths[row])
                draft.append_context(target_hidden[row : row + 1, :n], torch.arange(n)[None], cache, slots[row : row + 1])
            ctx_positions = lengths[:, None] + torch.arange(5)[None]
            valid = torch.arange(5)[None] < committed[:, None]
            context = (target_hidden[:, 20:25], ctx_positions, valid)
            block_positions = (lengths + committed)[:, None] + torch.arange(6)[None]
            out = cpu_draft.forward(draft, block, block_positions, cache, slots, context)
        return out, cache.k.clone()

    want_out, want_k = torch_path(run)
    assert not calls
    out, k = run()
    assert calls and calls[-1] == (18, target.config.dims.hidden_size)  # the draft pass went through C++, batched
    torch.testing.assert_close(out, want_out, rtol=0, atol=2e-5)
    for row in range(3):  # the committed context's K (stale entries past it are not compared)
        end = int(lengths[row] + committed[row])
        torch.testing.assert_close(k[:, slots[row], :, :end], want_k[:, slots[row], :, :end], rtol=0, atol=2e-5)


def test_unsupported_layers_and_passes_keep_the_torch_path(target):
    layers = target.model.layers
    positions = torch.arange(4, 8)[None]
    cache = target.new_cache(1, 16)
    with torch.inference_mode():
        assert cpu_layers.eligible(positions, cache)
        assert cpu_layers.eligible(torch.tensor([[4, 5, 6, 7], [9, 10, 11, 12]]), cache)  # a batch of blocks
        assert not cpu_layers.eligible(torch.tensor([[4, 5, 6, 7], [9, 10, 12, 13]]), cache)  # a gap in a row
        half = cpu_layers.MAX_ROWS // 2 + 1
        assert not cpu_layers.eligible(torch.arange(4, 4 + half)[None].expand(2, -1), cache)  # too many rows
        assert not cpu_layers.eligible(torch.tensor([[4, 5, 7]]), cache)  # not consecutive
        assert not cpu_layers.eligible(torch.arange(cpu_layers.MAX_ROWS + 1)[None], cache)  # prefill-sized
    assert not cpu_layers.eligible(positions, cache)  # autograd on (training)
    handle = layers[1].self_attn.o_proj.register_forward_hook(lambda *args: None)  # calibration hooks
    assert cpu_layers.plans(layers) is None
    handle.remove()
    assert cpu_layers.plans(layers) is not None
    original = layers[0].mlp.down_proj
    layers[0].mlp.down_proj = nn.Linear(original.in_features, original.out_features, bias=True)
    try:
        assert cpu_layers.plans(layers) is None
    finally:
        layers[0].mlp.down_proj = original
    bf16 = target.new_cache(1, 16)
    bf16.k = bf16.k.bfloat16()
    with torch.inference_mode():
        assert not cpu_layers.eligible(positions, bf16)


def test_a_replaced_weight_rebuilds_the_plan(target):
    layer = target.model.layers[0]
    plan = cpu_layers.plans(target.model.layers)[0]
    assert cpu_layers.plans(target.model.layers)[0] is plan  # cached while nothing changed
    old = layer.self_attn.o_proj.weight
    layer.self_attn.o_proj.weight = nn.Parameter(old.detach().clone(), requires_grad=False)
    try:
        fresh = cpu_layers.plans(target.model.layers)[0]
        assert fresh is not plan and fresh.objects[2] is layer.self_attn.o_proj.weight
        assert torch.equal(fresh.panels[1], plan.panels[1])  # same values, packed again
    finally:
        layer.self_attn.o_proj.weight = old


def test_weights_changed_in_place_are_repacked(target, torch_path):
    """An optimizer step or load_state_dict changes weights in place: the packed copies follow."""
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(8))
    decode_in_blocks(target, tokens, 30, 4)  # plans and head panels exist now
    state = {k: v.clone() for k, v in target.state_dict().items()}
    try:
        with torch.no_grad():
            for name, tensor in target.state_dict().items():
                if "norm" not in name:
                    tensor.mul_(1.5)
        want = torch_path(lambda: decode_in_blocks(target, tokens, 30, 4))
        got = decode_in_blocks(target, tokens, 30, 4)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=5e-5)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=5e-5)
    finally:
        target.load_state_dict(state)


def test_portable_build_without_avx2_equals_the_torch_path(target, torch_path, monkeypatch):
    """The same source built for the baseline ISA (its plain loops instead of AVX2 / FMA) is right too."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the portable build is the native one off x86")
    portable = cpu_ops.build_library(cpu_ops.PORTABLE_FLAGS, cpu_specific=False)
    tokens = torch.randint(0, 256, (1, 50), generator=torch.Generator().manual_seed(6))
    want_logits, want_taps = torch_path(lambda: decode_in_blocks(target, tokens, 30, 4))
    monkeypatch.setattr(cpu_ops, "library", lambda: portable)
    for layer in target.model.layers:  # plans hold panels packed by the other build: same layout, re-pack anyway
        layer.__dict__.pop("_cpu_plan", None)
    logits, taps = decode_in_blocks(target, tokens, 30, 4)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=2e-5)
    torch.testing.assert_close(taps, want_taps, rtol=0, atol=2e-5)
    _, one_by_one = decode_in_blocks(target, tokens, 30, 1)
    assert torch.equal(taps, one_by_one)
    x, w = torch.randn(5, 37), torch.randn(11, 37)
    with torch.inference_mode():
        torch.testing.assert_close(cpu_ops.matmul_nt(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_a_decode_checks_its_layer_plans_once(loaded_tiny_pair, monkeypatch):
    """A runner's passes (`weights_fixed_in` its memo) validate the plans on the first pass only; outside one,
    every pass checks them (so weights replaced between calls are still picked up)."""
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.runtime.local import generate

    pair = loaded_tiny_pair
    seen = []
    objects = cpu_layers._objects
    monkeypatch.setattr(cpu_layers, "_objects", lambda layer: seen.append(id(layer)) or objects(layer))
    request = Request(tuple(range(5, 17)), stop=StopCriteria(12))
    generate(pair, [request], autoregressive=True)
    assert len(seen) == len(pair.target.model.layers)  # 12 passes, one check
    seen.clear()
    generate(pair, [request], 8)
    assert len(seen) == len(pair.target.model.layers) + len(pair.draft.layers)
    seen.clear()
    with torch.inference_mode():
        for _ in range(3):
            cpu_layers.plans(pair.target.model.layers)
    assert len(seen) == 3 * len(pair.target.model.layers)
