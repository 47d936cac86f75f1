"""Tensor parallel: TP=2 over torch.distributed (two gloo processes) decodes exactly like TP=1."""

import subprocess
import sys
from pathlib import Path

import pytest
from convert_helpers import run_convert, with_random_biases
from tiny_models import make_draft, make_target

from dflash_trt.backends.torch.parallel import load_trtllm_pair
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.runtime.local import generate
from dflash_trt.runtime.tp import TPJob, tp_generate

pytestmark = pytest.mark.usefixtures("one_thread")

REQUESTS = (
    Request((5, 6, 7, 8), stop=StopCriteria(10)),
    Request((100, 3, 9, 41, 41, 7), SamplingParams(temperature=0.8, top_k=20, seed=7), StopCriteria(8)),
)
CASES = {  # name -> (pair, convert options)
    "fp32": ("gqa", {}),
    "llama_mqa_bias": ("mqa", {}),  # KV head duplicated, lm_head padded 255 -> 256, row-parallel biases
    "nvfp4_fp8kv": ("gqa", {"quant": "nvfp4", "kv_cache": "fp8"}),  # the simulated W4A4 + FP8 KV path
}


@pytest.fixture(scope="module")
def checkpoints(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    hf = make_target(root / "mqa" / "target", "llama", seed=5, num_key_value_heads=1, vocab_size=255,
                     attention_bias=True, mlp_bias=True)
    with_random_biases(hf, root / "mqa" / "target")
    make_draft(root / "mqa" / "draft", hf.config)
    pairs = {"gqa": tiny_pair[:2], "mqa": (root / "mqa" / "target", root / "mqa" / "draft")}
    out = {}
    for name, (pair, options) in CASES.items():
        for tp in (1, 2):
            out[name, tp] = root / f"{name}_tp{tp}"
            run_convert(*pairs[pair], out[name, tp], tp=tp, **options)
    return out


@pytest.mark.slow
def test_tp2_over_gloo_gives_the_same_tokens_as_tp1(checkpoints):
    jobs = [TPJob(str(checkpoints[name, 2] / "target"), str(checkpoints[name, 2] / "draft"), REQUESTS, 4)
            for name in CASES]
    tp2 = tp_generate(jobs, tp=2)  # raises if the two ranks disagree
    for name, results in zip(CASES, tp2):
        folder = checkpoints[name, 1]
        pair = load_trtllm_pair(folder / "target", folder / "draft", dtype="fp32", device="cpu")
        reference, _ = generate(pair, list(REQUESTS), block_size=4)
        for a, b in zip(results, reference):
            assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths, name


@pytest.mark.slow
def test_tp2_with_a_prefix_cache_restores_turns_and_decodes_like_tp1_without(checkpoints):
    """A session's turns on two ranks with a prefix cache: the later turns restore the blocks the first left
    (every rank the same ones, or the ranks would disagree) and give TP=1's tokens and acceptance without it."""
    first = tuple(range(3, 43))  # 40 tokens: two full 16-token blocks
    turns = (Request(first, stop=StopCriteria(10)), Request(first + (9, 9, 9), stop=StopCriteria(10)),
             Request(first[:20] + (50, 51), SamplingParams(temperature=0.8, seed=3), StopCriteria(8)))
    jobs = [TPJob(str(checkpoints[name, 2] / "target"), str(checkpoints[name, 2] / "draft"), turns, 4,
                  prefix_cache_bytes=1 << 20) for name in CASES]
    for name, results in zip(CASES, tp_generate(jobs, tp=2)):
        folder = checkpoints[name, 1]
        pair = load_trtllm_pair(folder / "target", folder / "draft", dtype="fp32", device="cpu")
        reference = [generate(pair, [turn], block_size=4, width_policy="schedule")[0][0] for turn in turns]
        for a, b in zip(results, reference):
            assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths, name
        assert [r.cached_tokens for r in results] == [0, 32, 16], name
        assert [r.cached_tokens for r in reference] == [0, 0, 0]


WORKER_TEARDOWN = """
import sys
from pathlib import Path
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.runtime.tp import TPJob, _worker
folder, target, draft = sys.argv[1:]
_worker(0, 1, folder, [TPJob(target, draft, (Request((5, 6, 7, 8), stop=StopCriteria(4)),), 4)])
left = [t.name for t in Path("/proc/self/task").iterdir() if "gloo" in (t / "comm").read_text()]
sys.exit(f"gloo threads alive after destroy_process_group: {left}" if left else 0)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc")
def test_worker_teardown_ends_gloos_threads(checkpoints, tmp_path):
    """A rank's `_worker` (run in a fresh interpreter, as a spawned rank is) leaves no gloo thread behind: one
    still alive at interpreter finalization that drops its last work must take the GIL there, and is killed
    (SIGABRT, "terminate called without an active exception")."""
    folder = checkpoints["fp32", 1]
    run = subprocess.run([sys.executable, "-c", WORKER_TEARDOWN, str(tmp_path), str(folder / "target"),
                          str(folder / "draft")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
