"""A check that a written PNG plot renders and is not blank, shared by the bench tests (not a test module)."""

import pytest


def png_ok(path, min_bytes=5_000):
    plt_image = pytest.importorskip("matplotlib.image")
    assert path.is_file() and path.stat().st_size > min_bytes
    pixels = plt_image.imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert pixels[..., :3].std() > 0.02, "plot is blank"
