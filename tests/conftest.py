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


def pytest_configure(config):
    import torch

    # Many small ops: one intra-op thread avoids OpenMP oversubscription on the 2-core CI machine.
    torch.set_num_threads(1)
