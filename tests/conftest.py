import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


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
    from dflash_trt.runtime.local import load_pair

    return load_pair(tiny_pair[0], tiny_pair[1], dtype="fp32", device="cpu")


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """A real tritonserver serving the shipped tiny pair's bundle (preset tiny-cpu): (server, pair, manifest)."""
    from dataclasses import replace

    from dflash_trt.engine.config import load_build_config
    from dflash_trt.engine.torch_backend import load_bundle
    from dflash_trt.runtime import backends
    from dflash_trt.triton.repository import publish
    from dflash_trt.triton.server import TritonServer

    root = tmp_path_factory.mktemp("served")
    cfg = load_build_config(Path(__file__).resolve().parents[1] / "build_configs" / "tiny-cpu.yaml")
    cfg = replace(cfg, output=str(root / "bundle"), repository=str(root / "repo"))
    bundle, manifest, _ = backends.build(cfg, log=lambda m: None)
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

    # Many small ops: one intra-op thread avoids OpenMP oversubscription on the 2-core CI machine.
    torch.set_num_threads(1)
