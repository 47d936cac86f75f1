"""The verify switch (dflash_trt.kernels.verify): which body runs, overrides, and its errors."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_trt.decoding import verify as reference
from dflash_trt.errors import ConfigError, MissingDependencyError
from dflash_trt.kernels import verify as dispatch

OP_SOURCE = Path(__file__).resolve().parents[1] / "plugins" / "dflash_verify" / "torch" / "verify_op.cpp"


@pytest.fixture(scope="session", autouse=True)
def _twin_cache(tmp_path_factory):
    os.environ.setdefault("DFLASH_TRT_CACHE_DIR", str(tmp_path_factory.mktemp("dflash_cache")))


@pytest.fixture(autouse=True)
def clean_switch(monkeypatch):
    """No override, no env var and a fresh op cache for every test."""
    monkeypatch.delenv(dispatch.ENV_IMPL, raising=False)
    monkeypatch.delenv(dispatch.ENV_LIB, raising=False)
    monkeypatch.setattr(dispatch, "impl_override", None)
    dispatch._find_op.cache_clear()
    yield
    dispatch._find_op.cache_clear()


def block(b=3, k=4, vocab=50, seed=0, temperature=0.8):
    """A small verify call: logits [B, K+1, V], drafts [B, K] and the per-request tensors [B]."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, vocab, generator=g)
    drafts = logits[:, :k].argmax(-1)
    drafts[0, 1] = (drafts[0, 1] + 1) % vocab  # row 0 rejects at slot 1
    return (logits, drafts, torch.arange(b, dtype=torch.int64) * 100, torch.full((b,), temperature),
            torch.full((b,), 10, dtype=torch.int64), torch.full((b,), 0.9), torch.arange(b, dtype=torch.int64) - 2)


def test_verify_block_is_a_drop_in_for_the_reference():
    assert inspect.signature(dispatch.verify_block).parameters.keys() == \
        inspect.signature(reference.verify_block).parameters.keys()


def test_default_is_auto_and_cpu_tensors_run_the_reference():
    args = block()
    assert dispatch.selected_impl() == "auto"
    assert dispatch.resolve_impl(args[0]) == "reference"
    for got, want in zip(dispatch.verify_block(*args), reference.verify_block(*args)):
        assert torch.equal(got, want)


def test_env_var_selects_and_is_validated(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_IMPL, "reference")
    assert dispatch.selected_impl() == "reference"
    monkeypatch.setenv(dispatch.ENV_IMPL, "fastest")
    with pytest.raises(ConfigError, match="reference, kernel, twin"):
        dispatch.selected_impl()


def test_module_override_wins_over_the_env_var_and_use_impl_restores(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_IMPL, "kernel")
    with dispatch.use_impl("reference"):
        assert dispatch.selected_impl() == "reference"
    assert dispatch.impl_override is None and dispatch.selected_impl() == "kernel"
    dispatch.impl_override = "twin"
    assert dispatch.selected_impl() == "twin"


def test_forcing_the_kernel_without_cuda_says_what_to_do():
    with dispatch.use_impl("kernel"), pytest.raises(MissingDependencyError, match="kernel cannot run"):
        dispatch.verify_block(*block())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")
def test_kernel_is_unavailable_on_a_cpu_build_and_says_why():
    assert not dispatch.kernel_available()
    assert "CUDA is not available" in dispatch.kernel_status()


def test_a_missing_or_broken_op_library_is_reported_not_raised(monkeypatch, tmp_path):
    """The named library counts even when an op of that name is registered already (another test, or
    scripts/gpu_check.sh, may have loaded the real one into this process)."""
    missing, broken = tmp_path / "missing.so", tmp_path / "broken.so"
    broken.write_bytes(b"not an ELF file")
    for library in (missing, broken):
        monkeypatch.setenv(dispatch.ENV_LIB, str(library))
        assert dispatch.load_op() is None
        assert str(library) in dispatch.load_error()


def test_a_library_that_registers_no_op_is_reported(monkeypatch, tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build a shared library")
    library = tmp_path / "registers_nothing.so"
    subprocess.run([cc, "-shared", "-fPIC", "-x", "c", "-", "-o", str(library)], input="int dflash_nothing;\n",
                   text=True, check=True)
    monkeypatch.setenv(dispatch.ENV_LIB, str(library))
    assert dispatch.load_op() is None
    assert str(library) in dispatch.load_error()


def test_twin_through_the_switch_matches_the_reference_with_next_block():
    args = block(b=4, k=5, temperature=0.7)
    with dispatch.use_impl("twin"):
        tokens, accepted, next_ids = dispatch.verify_block_next(*args, mask_token_id=77)
    want_tokens, want_accepted = reference.verify_block(*args)
    assert torch.equal(tokens, want_tokens) and torch.equal(accepted, want_accepted)
    assert accepted[0] == 1 and next_ids[0, 0] == tokens[0, 1]
    assert torch.equal(next_ids, dispatch.next_block_ids(want_tokens, want_accepted, 77))


def test_reference_path_returns_the_next_block_too():
    args = block()
    tokens, accepted, next_ids = dispatch.verify_block_next(*args, mask_token_id=9)
    assert next_ids.shape == tokens.shape and (next_ids[:, 1:] == 9).all()
    assert torch.equal(next_ids[:, 0], tokens.gather(1, accepted[:, None])[:, 0])


def test_kernel_branch_passes_contiguous_arguments_in_schema_order(monkeypatch):
    """The CUDA branch, with the op replaced by the CPU twin (no GPU needed)."""
    from dflash_trt.kernels import twin

    seen = {}

    def fake_op(logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id):
        seen["contiguous"] = all(t.is_contiguous() for t in (logits, drafts, start, temperature, top_k, top_p, seed))
        return twin.verify_block_next(logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id)

    monkeypatch.setattr(dispatch, "resolve_impl", lambda logits, sampled=False: "kernel")
    monkeypatch.setattr(dispatch, "load_op", lambda: fake_op)
    logits, drafts, *rest = block(b=2, k=3)
    strided = logits.transpose(0, 1).contiguous().transpose(0, 1)  # same values, not contiguous
    tokens, accepted = dispatch.verify_block(strided, drafts, *rest)
    assert seen["contiguous"]
    want = reference.verify_block(logits, drafts, *rest)
    assert torch.equal(tokens, want[0]) and torch.equal(accepted, want[1])


def test_twin_refuses_cuda_tensors(monkeypatch):
    class FakeCuda:
        is_cuda = True
        device = "cuda:0"

    with dispatch.use_impl("twin"), pytest.raises(ConfigError, match="CPU tensors"):
        dispatch.resolve_impl(FakeCuda())


def test_importing_the_package_compiles_and_loads_nothing():
    code = ("import sys, dflash_trt.kernels as k; "
            "print('dflash_trt.kernels.twin' in sys.modules, k.verify._find_op.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "0"]


@pytest.mark.gpu
def test_auto_uses_the_kernel_on_cuda_and_matches_the_reference():
    if not dispatch.kernel_available():
        pytest.skip(f"verify kernel not available: {dispatch.kernel_status()}")
    args = [a.cuda() for a in block(b=8, k=15, vocab=32000)]
    assert dispatch.resolve_impl(args[0]) == "kernel"
    got = dispatch.verify_block(*args)
    with dispatch.use_impl("reference"):
        want = dispatch.verify_block(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_served_runtime_verifies_through_the_switch(loaded_tiny_pair):
    """The scheduler's torch runner calls the one switch; forcing the CPU twin changes no token."""
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.kernels import use_impl
    from dflash_trt.runtime.service import DFlashService, ServiceLimits

    requests = [Request((1, 2, 3), SamplingParams(0.9, 20, 0.8, seed=4), StopCriteria(12)),
                Request((9, 8), SamplingParams(), StopCriteria(10))]
    expected = [r.tokens for r in autoregressive_generate(loaded_tiny_pair.target, requests)]
    with use_impl("twin"):
        svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=2, max_seq_len=64, block_size=4))
        try:
            assert [r.tokens for r in svc.generate(requests)] == expected
        finally:
            svc.shutdown()


def test_auto_runs_the_twin_for_sampled_cpu_rows_and_it_matches_the_reference():
    """auto on CPU: greedy rows -> the torch reference (an argmax); sampled rows -> the C++ twin, bit-identical."""
    from dflash_trt.decoding import sampling

    if not dispatch.twin_available():
        pytest.skip("no C++ compiler / plugin sources for the twin")
    logits, drafts, start, temperature, top_k, top_p, seed = block(b=4, k=3)
    assert dispatch.resolve_impl(logits, sampled=False) == "reference"
    assert dispatch.resolve_impl(logits, sampled=True) == "twin"
    temperature = torch.tensor([0.0, 0.7, 1.3, 2.0])
    got = dispatch.verify_block(logits, drafts, start, temperature, top_k, top_p, seed)
    want = reference.verify_block(logits, drafts, start, temperature, top_k, top_p, seed)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    rows, positions = logits.reshape(-1, logits.shape[-1]), torch.arange(16)  # 4 rows x 4 slots
    params = (temperature.repeat_interleave(4), top_k.repeat_interleave(4), top_p.repeat_interleave(4),
              seed.repeat_interleave(4))
    ids = torch.randperm(1000)[: rows.shape[1]]  # a draft vocabulary's ids, unsorted
    for vocab_ids in (None, ids):
        assert torch.equal(dispatch.sample_tokens(rows, positions, *params, vocab_ids),
                           sampling.sample_tokens(rows, positions, *params, vocab_ids))
    with dispatch.use_impl("reference"):
        assert dispatch.resolve_impl(logits, sampled=True) == "reference"


def op_schema() -> str:
    """The schema plugins/dflash_verify/torch/verify_op.cpp defines (its TORCH_LIBRARY block's string literals)."""
    block = re.search(r"TORCH_LIBRARY\(dflash_verify, m\) \{\s*m\.def\((.*?)\);", OP_SOURCE.read_text(), re.S)
    return "".join(re.findall(r'"([^"]*)"', block.group(1)))


STAND_IN_FIRST = """
import sys, pytest, torch
stand_in = torch.library.Library("dflash_verify", "DEF")  # what loading the real op leaves behind
stand_in.define(sys.argv[1])
assert str(torch.ops.dflash_verify.verify_block.default._schema) == "dflash_verify::" + sys.argv[1]
sys.exit(pytest.main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_dispatch_checks_pass_with_the_op_registered_first():
    """The checks above with `dflash_verify::verify_block` registered before they run, as when the GPU tests
    loaded the real op earlier in the same process (in a subprocess: a registration cannot be undone)."""
    select = ["-k", "not registered_first and not served_runtime and not named_library", "-m", "not gpu"]
    done = subprocess.run([sys.executable, "-c", STAND_IN_FIRST, op_schema(), __file__, "-v", "-p", "no:cacheprovider",
                           *select], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for name in ("test_a_missing_or_broken_op_library_is_reported_not_raised",
                 "test_a_library_that_registers_no_op_is_reported"):
        assert re.search(name + r"\S* PASSED", done.stdout), name


NAMED_LIBRARY = """
import os, sys, torch
from dflash_trt.kernels import verify as dispatch
library, copy, schema = sys.argv[1:]
os.environ[dispatch.ENV_LIB] = library
op = dispatch.load_op()
assert op is not None and dispatch.load_error() is None, dispatch.load_error()
assert str(op.default._schema) == "dflash_verify::" + schema
dispatch._find_op.cache_clear()
assert dispatch.load_op() is op and list(torch.ops.loaded_libraries) == [os.path.realpath(library)]
os.environ[dispatch.ENV_LIB] = copy  # the same namespace again: loading it would abort this process
assert dispatch.load_op() is None and "registered already" in dispatch.load_error(), dispatch.load_error()
print("still running")
"""


@pytest.mark.slow
def test_a_named_library_loads_once_and_a_second_one_is_refused_not_fatal(tmp_path):
    """A real op library (a CPU stand-in defining the op's schema with TORCH_LIBRARY) loads through
    $DFLASH_TRT_VERIFY_LIB once per path; a second library defining the same namespace is refused, where
    loading it would end the process from its static initializer."""
    from torch.utils import cpp_extension

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "stand_in.cpp"
    source.write_text('#include <torch/library.h>\nTORCH_LIBRARY(dflash_verify, m) { m.def("%s"); }\n' % op_schema())
    torch_lib = Path(torch.__file__).parent / "lib"
    library = tmp_path / "stand_in.so"
    includes = [f"-isystem{p}" for p in cpp_extension.include_paths()]
    subprocess.run([cxx, "-std=c++20", "-shared", "-fPIC", "-O0", *includes, str(source),
                    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-L{torch_lib}",
                    "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_lib}", "-o", str(library)], check=True, timeout=300)
    copy = tmp_path / "stand_in_copy.so"
    shutil.copy(library, copy)
    done = subprocess.run([sys.executable, "-c", NAMED_LIBRARY, str(library), str(copy), op_schema()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "still running" in done.stdout, done.stderr[-3000:]
