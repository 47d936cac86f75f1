"""Fixtures and helpers every test module shares (tests import no other test module)."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

VARIANTS = [(0, 1.0), (10, 1.0), (0, 0.9), (40, 0.6), (3, 0.95)]  # (top_k, top_p)


def random_requests(temperature: float, n: int = 50, seed: int = 0, vocab: int = 255) -> list:
    """Ragged requests over a vocabulary of `vocab`: prompts of 1-40 tokens, budgets of 1-40, stop tokens on every
    fourth, each with its own seed and one of VARIANTS' top-k / top-p."""
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams

    rng = random.Random(seed)
    out = []
    for i in range(n):
        top_k, top_p = VARIANTS[i % len(VARIANTS)]
        prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(1, 40)))
        stops = frozenset(rng.sample(range(vocab), 3)) if i % 4 == 0 else frozenset()
        out.append(Request(prompt, SamplingParams(temperature, top_k, top_p, seed=rng.randrange(2**64)),
                           StopCriteria(rng.randint(1, 40), stops)))
    return out


@pytest.fixture(scope="module")
def one_thread():
    """torch at one intra-op thread for a whole module, restored after it; request it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`. Tiny models: intra-op threads only add overhead,
    and stall badly when other jobs share the cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def make_requests():
    """`random_requests(temperature, n=50, seed=0)`: ragged random requests for the tiny random pair."""
    return random_requests


@pytest.fixture(scope="session")
def shipped_pair():
    """The shipped tiny pair, fp32 on CPU (its draft vocabulary off)."""
    from dflash_trt.engine.config import ASSETS
    from dflash_trt.model.loader import load_pair

    return load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", dtype="fp32", device="cpu")


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A random tiny Qwen3 target (4 layers, hidden 64, vocab 256) and a 2-layer drafter."""
    from tiny_models import make_draft, make_target

    root = tmp_path_factory.mktemp("tiny_pair")
    hf = make_target(root / "target", "qwen3")
    oracle = make_draft(root / "draft", hf.config)
    return root / "target", root / "draft", hf, oracle


@pytest.fixture(scope="session")
def loaded_tiny_pair(tiny_pair):
    from dflash_trt.model.loader import load_pair

    return load_pair(tiny_pair[0], tiny_pair[1], dtype="fp32", device="cpu")


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """A real tritonserver serving the shipped tiny pair's bundle (preset tiny-cpu): (server, pair, manifest)."""
    from dataclasses import replace

    from dflash_trt.backends.torch.bundle import load_bundle
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.runtime.build import build
    from dflash_trt.triton.repository import publish
    from dflash_trt.triton.server import TritonServer

    root = tmp_path_factory.mktemp("served")
    cfg = load_build_config(Path(__file__).resolve().parents[1] / "build_configs" / "tiny-cpu.yaml")
    cfg = replace(cfg, output=str(root / "bundle"), repository=str(root / "repo"))
    bundle, manifest, _ = build(cfg, log=lambda m: None)
    repo = publish(bundle, root / "repo")
    server = TritonServer(repo, log_path=root / "server.log", http_host="127.0.0.1").start(timeout=180)
    _, pair = load_bundle(bundle, device="cpu")
    yield server, pair, manifest
    server.stop()


@pytest.fixture(scope="session")
def front(served):
    """The guarded HTTP front (triton/front_app.py) before `served`: its host:port."""
    from dflash_trt.triton.front_app import Front, make_app
    from dflash_trt.triton.server import free_port

    server = served[0]
    port = free_port()
    models = frozenset(server.models) - {"ensemble"}
    app = make_app(server.url, server.grpc_url, models, ensembles=frozenset(server.models) & {"ensemble"})
    running = Front(app, "127.0.0.1", port).start()
    yield f"127.0.0.1:{port}"
    running.stop()


def pytest_configure(config):
    import torch

    from dflash_trt.model.loader import cpu_threads

    # Many small ops: one intra-op thread (the default) avoids OpenMP oversubscription on the 2-core CI machine;
    # DFLASH_TRT_CPU_THREADS=2 runs the suite as CPU decoding with two threads runs (torch and the C++ passes).
    torch.set_num_threads(cpu_threads())
