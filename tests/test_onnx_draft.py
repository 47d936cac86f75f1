"""The draft engine's source graphs (ONNX), run by onnxruntime, are token-identical to the torch drafter.

The graphs a TensorRT draft engine is compiled from are exported here and executed on CPU by
onnxruntime inside full speculative decodes through the serving scheduler: at every step the
onnxruntime proposals must equal the torch drafter's, and the committed tokens must equal the
torch path's (and autoregressive decoding's).
"""

from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from draft_runners import GreedyDrafts  # noqa: E402

from dflash_trt.backends.torch.runners import TorchDraftRunner, TorchTargetRunner  # noqa: E402
from dflash_trt.backends.trtllm.draft_runner import ort_draft_runner  # noqa: E402
from dflash_trt.backends.trtllm.io_spec import DraftGraphSpec  # noqa: E402
from dflash_trt.backends.trtllm.onnx_export import (  # noqa: E402
    GRAPH_FILES,
    export_draft_graphs,
    spec_for,
)
from dflash_trt.decoding.requests import Request, StopCriteria  # noqa: E402
from dflash_trt.decoding.sampling import SamplingParams  # noqa: E402
from dflash_trt.runtime.generate import decode  # noqa: E402

ASSETS = Path(__file__).resolve().parent.parent / "dflash_trt" / "assets"
SLOTS, MAX_SEQ = 4, 128
ONNX_TYPES = {1: "float32", 7: "int64", 16: "bfloat16", 10: "float16", 6: "int32"}


class Lockstep:
    """A DraftRunner that feeds both drafters, proposes with the graph one, records both proposals."""

    def __init__(self, reference, candidate):
        self.reference, self.candidate = reference, candidate
        self.block_size = candidate.block_size
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []

    def append_context(self, *args):
        self.reference.append_context(*args)
        self.candidate.append_context(*args)

    def commit(self, *args):
        self.reference.commit(*args)
        self.candidate.commit(*args)

    def propose(self, *args, rows=None):
        """Graphs for greedy requests: both with greedy drafts (those graphs end in an argmax). Sampled
        graphs: both with the requests' sampling (coupled drafts for sampled rows)."""
        args = args if self.candidate.spec.sampled else args[:4]
        expected, got = self.reference.propose(*args), self.candidate.propose(*args)
        self.steps.append((expected.clone(), got.clone()))
        return got


def _export(pair, folder: Path, sampled: bool = False) -> DraftGraphSpec:
    block_size = pair.draft.config.block_size
    spec = spec_for(pair.draft, pair.target, block_size, MAX_SEQ + block_size + 1, SLOTS, "fp32", sampled)
    export_draft_graphs(pair.draft, pair.target, spec, folder)
    return spec


def _requests(vocab: int, seed: int = 0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 0.0), (17, 0.8), (3, 0.0), (30, 1.0), (9, 0.0), (12, 0.5)]
    return [Request(tuple(torch.randint(0, vocab, (n,), generator=g).tolist()), SamplingParams(t, 0, 1.0, i),
                    StopCriteria(32)) for i, (n, t) in enumerate(shapes)]


def _check_lockstep_decode(pair, folder: Path, requests: list[Request], schedule=None) -> Lockstep:
    block_size, capacity = pair.draft.config.block_size, MAX_SEQ + pair.draft.config.block_size + 1
    taps = pair.draft.config.target_layer_ids
    torch_draft = TorchDraftRunner(pair.draft, pair.target, SLOTS, capacity, block_size)
    graph_draft = ort_draft_runner(folder, SLOTS)
    lockstep = Lockstep(torch_draft, graph_draft)
    got = decode(TorchTargetRunner(pair.target, SLOTS, capacity, taps), lockstep, requests, SLOTS,
                 block_size_schedule=schedule)
    reference_draft = TorchDraftRunner(pair.draft, pair.target, SLOTS, capacity, block_size)
    reference = decode(TorchTargetRunner(pair.target, SLOTS, capacity, taps),
                       reference_draft if graph_draft.spec.sampled else GreedyDrafts(reference_draft), requests, SLOTS, block_size_schedule=schedule)
    ar = decode(TorchTargetRunner(pair.target, SLOTS, capacity, ()), None, requests, SLOTS)
    for step, (expected, proposed) in enumerate(lockstep.steps):
        assert torch.equal(expected, proposed), f"step {step}: onnxruntime proposed {proposed} != torch {expected}"
    assert [r.tokens for r in got] == [r.tokens for r in reference] == [r.tokens for r in ar]
    assert [r.acceptance_lengths for r in got] == [r.acceptance_lengths for r in reference]
    lockstep.accepted = sum(a - 1 for r in got for a in r.acceptance_lengths)  # drafts accepted in all
    return lockstep


@pytest.fixture(scope="module", params=[False, True], ids=["greedy-graphs", "sampled-graphs"])
def exported(loaded_tiny_pair, tmp_path_factory, request):
    """Graphs for greedy requests only, and graphs for sampled requests (which also return the draft logits)."""
    folder = tmp_path_factory.mktemp("onnx_draft")
    return loaded_tiny_pair, folder, _export(loaded_tiny_pair, folder, sampled=request.param)


def test_onnx_graph_io_matches_the_declared_spec(exported):
    _, folder, spec = exported
    for name, io in (("context", spec.context_io()), ("propose", spec.propose_io())):
        model = onnx.load(str(folder / GRAPH_FILES[name]))
        onnx.checker.check_model(model)
        for declared, actual in ((io[0], model.graph.input), (io[1], model.graph.output)):
            assert [t.name for t in declared] == [v.name for v in actual]
            for t, v in zip(declared, actual):
                assert ONNX_TYPES[v.type.tensor_type.elem_type] == t.dtype, t.name
                dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                assert dims == list(t.dims), t.name
    assert DraftGraphSpec.load(folder) == spec


def test_onnx_context_graph_writes_the_torch_context_cache(exported):
    """Ragged multi-row appends into scattered slots, then rewinds: caches and proposals agree."""
    pair, folder, spec = exported
    capacity, block = spec.capacity, spec.block_size
    torch_draft = TorchDraftRunner(pair.draft, pair.target, SLOTS, capacity, block)
    graph_draft = ort_draft_runner(folder, SLOTS)
    g = torch.Generator().manual_seed(3)
    slots, lengths = torch.tensor([3, 0, 2]), torch.zeros(3, dtype=torch.int64)
    for round_ in range(4):
        width = 6
        taps = torch.randn(3, width, spec.n_taps * spec.hidden_size, generator=g)
        positions = lengths[:, None] + torch.arange(width)[None, :]
        valid = torch.arange(width)[None, :] < torch.randint(1, width + 1, (3, 1), generator=g)
        for runner in (torch_draft, graph_draft):
            runner.append_context(slots, taps, positions, valid)
        lengths = lengths + valid.sum(1)
        if round_ == 2:
            lengths = lengths - torch.tensor([1, 0, 2]).clamp(max=lengths - 1)  # rewind some slots
        for runner in (torch_draft, graph_draft):
            runner.commit(slots, lengths)
        bonus = torch.randint(0, spec.vocab_size, (3,), generator=g)
        for width in (block, 2 + round_):
            assert torch.equal(torch_draft.propose(slots, bonus, lengths, width),
                               graph_draft.propose(slots, bonus, lengths, width))
    for s, n in zip(slots.tolist(), lengths.tolist()):
        torch.testing.assert_close(graph_draft.k[:, s, :, :n], torch_draft.cache.k[:, s, :, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(graph_draft.v[:, s, :, :n], torch_draft.cache.v[:, s, :, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("schedule", [None, {2: 5, 4: 3}])
def test_onnx_draft_decode_is_token_identical_to_torch(exported, schedule):
    """Full block, and a verify-width schedule that narrows the block as the batch grows."""
    pair, folder, _ = exported
    lockstep = _check_lockstep_decode(pair, folder, _requests(pair.target.config.vocab_size), schedule)
    assert len(lockstep.steps) > 20
    widths = {proposed.shape[1] + 1 for _, proposed in lockstep.steps}
    full = pair.draft.config.block_size
    assert max(widths) == full if schedule is None else {5, 3} <= widths  # (the last blocks narrow too)
    assert widths <= set(range(1, full + 1))


@pytest.mark.slow
@pytest.mark.parametrize("target,draft", [("tiny-qwen3", "tiny-qwen3-dflash")])
def test_onnx_draft_decode_on_the_shipped_pair(target, draft, tmp_path):
    """Greedy graphs, then sampled ones: on the trained pair the sampled rows' coupled drafts (the same as
    the torch runner's, step by step) are accepted more often than the greedy graphs' argmax drafts."""
    if not (ASSETS / draft / "config.json").is_file():
        pytest.skip(f"shipped pair not present ({ASSETS / draft}/config.json)")
    from dflash_trt.model.loader import load_pair

    pair = load_pair(ASSETS / target, ASSETS / draft, dtype="fp32", device="cpu")
    requests = _heldout_requests(pair, temperature=1.0, n=8)
    accepted = {}
    for sampled in (False, True):
        _export(pair, tmp_path / str(sampled), sampled)
        lockstep = _check_lockstep_decode(pair, tmp_path / str(sampled), requests)
        assert len(lockstep.steps) > 5
        accepted[sampled] = lockstep.accepted
    assert accepted[True] > accepted[False], accepted


def _heldout_requests(pair, temperature: float, n: int) -> list[Request]:
    """`n` of the shipped held-out prompts (their first 32 tokens), sampled at `temperature`, seeds 0..n-1."""
    import json

    lines = (ASSETS / "heldout_prompts.jsonl").read_text().splitlines()[:n]
    return [Request(tuple(json.loads(line)["token_ids"][:32]), SamplingParams(temperature, seed=i), StopCriteria(48))
            for i, line in enumerate(lines)]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy-graphs", "sampled-graphs"])
def test_onnx_draft_with_a_draft_vocabulary_proposes_like_torch(tiny_pair, tmp_path, sampled):
    """A draft vocabulary goes into the propose graph (head rows + id gather; sampled graphs return its
    columns' logits and write its ids beside the graphs): the same proposals as torch."""
    from dflash_trt.backends.trtllm.io_spec import DRAFT_VOCAB_FILE
    from dflash_trt.model.loader import load_pair

    pair = load_pair(tiny_pair[0], tiny_pair[1], dtype="fp32", device="cpu")
    ids = torch.randperm(pair.target.config.vocab_size, generator=torch.Generator().manual_seed(5))[:64].tolist()
    pair.draft.use_vocab(ids, pair.target.lm_head)
    _export(pair, tmp_path, sampled)
    assert (tmp_path / DRAFT_VOCAB_FILE).is_file() == sampled
    lockstep = _check_lockstep_decode(pair, tmp_path, _requests(pair.target.config.vocab_size, seed=2))
    proposed = torch.cat([p.flatten() for _, p in lockstep.steps])
    assert len(lockstep.steps) > 5 and set(proposed.tolist()) <= set(ids)


def test_bf16_graphs_export_with_bf16_io(tiny_pair, tmp_path):
    """What a GPU build exports (bf16): valid ONNX with bf16 float I/O (onnxruntime's CPU provider has no
    bf16 kernels, so only TensorRT runs these)."""
    from dflash_trt.model.loader import load_pair

    pair = load_pair(tiny_pair[0], tiny_pair[1], dtype="bf16", device="cpu", native_dtype=True)
    spec = spec_for(pair.draft, pair.target, pair.draft.config.block_size, 64, 2, "bf16")
    for name, path in export_draft_graphs(pair.draft, pair.target, spec, tmp_path).items():
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
        floats = {v.name for v in [*model.graph.input, *model.graph.output] if v.type.tensor_type.elem_type == 16}
        assert floats == ({"target_hidden", "context_k", "context_v"} if name == "context" else {"context_k", "context_v"})
