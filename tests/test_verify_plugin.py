"""The verification plugin against the torch reference: CPU twin, emulated kernels, nvcc, GPU.

The CPU twin runs the kernels' own row code (plugins/dflash_verify/include/dflash_verify/
row_select.h) on the host, so twin == reference on CPU checks the kernel logic here; the CTA
emulator runs verify_kernels.cu itself on fiber "threads" (twin == emulator checks the CUDA
layer); the `gpu` tests check kernel == twin == reference exactly on a CUDA
machine. Token choices must agree bit for bit, top-p included: the reference and the kernel share
one exact fixed-point definition of the top-p mass (checked at V = 151936 on flat rows below).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from verify_rows import NAN, NEG_INF, params, random_rows

from dflash_trt import host_build
from dflash_trt.decoding.sampling import gumbel, log_f32, sample_tokens, survivors
from dflash_trt.decoding.verify import verify_block
from dflash_trt.kernels import archs, twin
from dflash_trt.kernels import verify as dispatch

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "dflash_verify"
NVCC_FLAGS = ["-std=c++17", "-O3", "-fatbin", "--threads", "0", "-Werror", "all-warnings",
              "-Xcompiler", "-Wall,-Wextra,-Werror", f"-I{PLUGIN / 'include'}"]
# The resource gate on every cubin of that compile (ptxas -v). 64 registers: two 512-thread blocks fit an SM's
# 65,536 registers, so at large batch an SM verifies two rows at once (one above 64). 48 KiB: the most static
# shared memory a block may declare, and two such blocks fit the smallest SM of the list (100 KiB: sm_86, 89,
# 120). No spills and no stack frame: local memory is traffic to L2 and HBM that the kernels exist to avoid.
MAX_REGISTERS = 64
MAX_STATIC_SMEM = 48 * 1024


@pytest.fixture(scope="session", autouse=True)
def _twin_cache(tmp_path_factory):
    """Build the twin once per session into a temp cache (rebuilt whenever its sources change)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler for the CPU twin")
    os.environ.setdefault("DFLASH_TRT_CACHE_DIR", str(tmp_path_factory.mktemp("dflash_cache")))
    twin.library()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small tensors: intra-op threads only add overhead, and stall badly on shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class NvccJob:
    """The every-arch compile running in the background: its fatbin and, once done, nvcc's output."""

    proc: subprocess.Popen
    fatbin: Path
    _output: list = field(default_factory=list)

    def output(self) -> str:
        """nvcc's stdout + stderr (ptxas resource lines included), waiting for the compile the first time."""
        if not self._output:
            self._output.append(self.proc.communicate(timeout=400)[0])
        return self._output[0]


@pytest.fixture(scope="module")
def nvcc_job(request, tmp_path_factory):
    """Start the every-arch nvcc compile (kernels/archs.py) in the background; the test_kernels_* tests wait for
    it: one compile gives the fatbin, its warnings and every cubin's registers, spills and shared memory."""
    nvcc = shutil.which("nvcc")
    selected = any(item.name.startswith("test_kernels_") for item in request.session.items)
    if nvcc is None or not selected:
        yield None
        return
    known = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True).stdout.split()
    missing = [a for a in archs.SASS if f"sm_{a}" not in known]
    if missing:
        yield f"this nvcc cannot target {missing} (needs CUDA >= 12.9)"
        return
    out = tmp_path_factory.mktemp("nvcc") / "verify_kernels.fatbin"
    cmd = [nvcc, *NVCC_FLAGS, "-Xptxas", "-v", *archs.gencode_flags(), str(PLUGIN / "src" / "verify_kernels.cu"),
           "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield NvccJob(proc, out)
    if proc.poll() is None:  # the compile test failed early or was interrupted
        proc.kill()
        proc.communicate()


@pytest.fixture(autouse=True)
def _start_nvcc_early(nvcc_job):
    """Requesting nvcc_job from every test starts the compile alongside the first one."""


def assert_same_tokens(logits, positions, temperature, top_k, top_p, seed):
    want = sample_tokens(logits, positions, temperature, top_k, top_p, seed)
    got = twin.sample_tokens(logits, positions, temperature, top_k, top_p, seed)
    bad = (want != got).nonzero().flatten().tolist()
    assert not bad, [(i, float(temperature[i]), int(top_k[i]), float(top_p[i]), int(want[i]), int(got[i]))
                     for i in bad[:5]]


# ---------------------------------------------------------------------------------------------
# Scalar pieces, bit for bit
# ---------------------------------------------------------------------------------------------

def test_twin_log_f32_matches_reference_bits():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0x00800000, 0x7F7FFFFF, (400_000,), generator=g, dtype=torch.int64).to(torch.int32)
    special = torch.tensor([0.70710677, 0.70710683, 1.0, 0.5, 2.0, 1 - 2**-24, 2**-24, 3e38])
    x = torch.cat([bits.view(torch.float32), special])
    assert torch.equal(twin.log_f32(x).view(torch.int32), log_f32(x).view(torch.int32))


def test_twin_gumbel_matches_reference_bits_for_any_seed_and_position():
    g = torch.Generator().manual_seed(1)
    n = 400_000
    seed = torch.randint(-2**63, 2**63 - 1, (n,), generator=g)
    position = torch.randint(0, 2**62, (n,), generator=g)  # only the low 32 bits enter the hash
    vocab = torch.randint(0, 2**20, (n,), generator=g)
    assert torch.equal(twin.gumbel(seed, position, vocab).view(torch.int32),
                       gumbel(seed, position, vocab).view(torch.int32))


def test_batched_log_equals_log_f32_on_every_input_the_noise_can_give():
    """The batched sampling path's log (frexp on the bits, a select for the fold) == log_f32 on all 2**23
    values u = (k + 0.5) / 2**23 the hash can give and on every -log(u): exhaustive for g's two logs."""
    u = ((torch.arange(1 << 23, dtype=torch.float64) + 0.5) / 2**23).float()
    inner = twin.log_f32(u)
    assert torch.equal(twin.log_normal(u).view(torch.int32), inner.view(torch.int32))
    assert torch.equal(twin.log_normal(-inner).view(torch.int32), twin.log_f32(-inner).view(torch.int32))


def test_batched_gumbel_equals_the_rule_for_any_seed_and_position():
    g = torch.Generator().manual_seed(11)
    for _ in range(8):
        seed = int(torch.randint(-2**63, 2**63 - 1, (1,), generator=g))
        position = int(torch.randint(0, 2**62, (1,), generator=g))
        ids = torch.randint(0, 2**31, (50_000,), generator=g)
        want = gumbel(torch.full_like(ids, seed), torch.full_like(ids, position), ids)
        assert torch.equal(twin.gumbel_batched(seed, position, ids).view(torch.int32), want.view(torch.int32))


def test_batched_sampling_equals_the_streaming_rule_and_the_reference_with_a_subset():
    """Sampled rows take the batched path; the per-element rule (what CUDA runs) picks the same tokens; a
    draft-vocabulary subset (ids ascending) equals the reference's vocab_ids rule."""
    g = torch.Generator().manual_seed(12)
    for vocab in (1, 7, 300, 1213, 4096):
        logits, positions, temperature, top_k, top_p, seed = random_rows(g, 128, vocab)
        batched = twin.sample_tokens(logits, positions, temperature, top_k, top_p, seed)
        assert torch.equal(batched, twin.sample_tokens(logits, positions, temperature, top_k, top_p, seed,
                                                       streaming=True))
        ids = torch.randperm(5 * vocab, generator=g)[:vocab]
        want = sample_tokens(logits, positions, temperature, top_k, top_p, seed, ids)
        assert torch.equal(dispatch.sample_tokens(logits, positions, temperature, top_k, top_p, seed, ids), want)


def test_exp_neg_is_exact_at_zero_and_within_two_ulp():
    x = -torch.rand(200_000, generator=torch.Generator().manual_seed(2)) * 87
    rel = (twin.exp_neg(x).double() / x.double().exp() - 1).abs().max()
    assert rel < 2 * 2**-24
    edges = twin.exp_neg(torch.tensor([0.0, -0.0, -104.0, NEG_INF, -1e30])).tolist()
    assert edges == [1.0, 1.0, 0.0, 0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# The sampling rule: >= 10,000 random rows, then adversarial ones
# ---------------------------------------------------------------------------------------------

def test_twin_matches_reference_on_10k_random_rows():
    g = torch.Generator().manual_seed(3)
    rows = 0
    while rows < 10_240:
        vocab = int(torch.randint(1, 700, (1,), generator=g))
        case = random_rows(g, 256, vocab)
        assert_same_tokens(*case)
        logits, _, temperature, top_k, top_p, _ = case
        s = temperature > 0
        canonical = logits[s].float().nan_to_num(nan=NEG_INF, posinf=float("inf"), neginf=NEG_INF)
        want = survivors(canonical / temperature[s, None], top_k[s], top_p[s])
        assert torch.equal(twin.keep_mask(logits[s].float(), temperature[s], top_k[s], top_p[s]), want)
        rows += 256


@pytest.mark.parametrize("vocab", [1, 2, 3, 4, 5, 511, 513, 1025, 4099])
def test_vocab_not_a_multiple_of_the_block_or_vector_width(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits, positions, _, _, _, seed = random_rows(g, 64, vocab)
    for temperature, top_k, top_p in [(0.0, 0, 1.0), (0.9, 0, 1.0), (0.9, 3, 0.7)]:
        _, t, k, p, _ = params(64, temperature, top_k, top_p)
        assert_same_tokens(logits, positions, t, k, p, seed)


def test_greedy_ties_take_the_lowest_id_and_ignore_top_k_top_p():
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, 9.0, 9.0]])
    for top_k, top_p in [(0, 1.0), (1, 0.1), (3, 0.5)]:
        p = params(3, temperature=0.0, top_k=top_k, top_p=top_p)
        assert twin.sample_tokens(logits, *p).tolist() == [1, 0, 2]
        assert_same_tokens(logits, *p)


def test_nan_and_inf_rows_follow_the_reference():
    rows = torch.tensor([
        [NAN, NAN, NAN, NAN],            # all NaN -> token 0
        [NAN, NEG_INF, NAN, NEG_INF],    # NaN and -inf are both -inf: token 0
        [NEG_INF, NEG_INF, NEG_INF, NEG_INF],
        [NEG_INF, 2.0, NAN, 2.0],
        [NAN, NEG_INF, 0.5, NEG_INF],
    ])
    for temperature in (0.0, 0.5, 1.0, 2.0, 1e33):  # 1e33: -inf must stay unsampled at any temperature
        for top_k, top_p in [(0, 1.0), (1, 1.0), (3, 1.0), (0, 0.5), (2, 0.3)]:
            for seed in (0, 2**63 + 5, 2**64 - 1):
                assert_same_tokens(rows, *params(len(rows), temperature, top_k, top_p, seed))
    assert twin.sample_tokens(rows[:2], *params(2, temperature=0.0)).tolist() == [0, 0]
    assert twin.sample_tokens(rows[3:4], *params(1, temperature=1e33)).tolist()[0] in (1, 3)


def test_top_k_edges():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(32, 50, generator=g).round()  # ties at the k-th value
    for top_k in (-3, 1, 2, 7, 49, 50, 51, 10**9):
        for temperature in (0.3, 1.0, 3.0):
            assert_same_tokens(logits, *params(32, temperature, top_k, 1.0, seed=top_k % 97))
    tied = torch.zeros(4, 16)
    keep = twin.keep_mask(tied, torch.ones(4), torch.full((4,), 1), torch.ones(4))
    assert keep.all()  # ties at the edge stay


def test_top_p_edges_with_exact_masses():
    # Uniform tie groups give exact probabilities (1/4 each; the -200 group underflows to 0).
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0] + [-200.0] * 12] * 6)
    for top_p in (1e-9, 0.25, 0.5, 0.75, 0.9999999, 1.0):
        p = params(6, 1.0, 0, top_p, seed=11)
        assert_same_tokens(logits, *p)
        keep = twin.keep_mask(logits, p[1], p[2], p[3])
        assert keep[:, :4].all() and (top_p == 1.0 or not keep[:, 4:].any())
    # Two groups: {0.5, 0.5} x 2**-k spread; top_p at and around the first group's mass.
    two = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]).log().nan_to_num(neginf=-300.0).expand(8, -1)
    for top_p in (0.4, 0.5, 0.5000001, 0.9, 1.0):
        assert_same_tokens(two.contiguous(), *params(8, 1.0, 0, top_p))


def test_top_p_at_or_below_zero_keeps_nothing_like_the_reference():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(5))
    for top_p in (0.0, -1.0):
        p = params(4, 1.0, 0, top_p)
        assert_same_tokens(logits, *p)
        assert twin.sample_tokens(logits, *p).tolist() == [0, 0, 0, 0]


def test_extreme_scores_disable_the_gumbel_prefilter_safely():
    g = torch.Generator().manual_seed(6)
    for scale, temperature in [(1e3, 1e-3), (3e7, 1.0), (1e-6, 50.0), (1.0, 1e-30)]:
        logits = torch.randn(16, 300, generator=g) * scale
        for top_k, top_p in [(0, 1.0), (5, 1.0), (0, 0.8)]:
            assert_same_tokens(logits, *params(16, temperature, top_k, top_p, seed=123))


def test_signed_zeros_and_subnormals():
    logits = torch.tensor([[-0.0, 0.0, -0.0, 1e-45], [0.0, -0.0, -1e-45, -0.0]]).repeat(8, 1)
    for temperature, top_k in [(0.0, 0), (1.0, 0), (1.0, 2), (1e-3, 1)]:
        positions, t, k, p, s = params(16, temperature, top_k)
        assert_same_tokens(logits, torch.arange(16), t, k, p, s)


# ---------------------------------------------------------------------------------------------
# verify_block: tokens, acceptance, next block
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 3, 15])
def test_twin_verify_block_matches_reference(k):
    g = torch.Generator().manual_seed(100 + k)
    b, vocab = 48, 97
    logits, _, temperature, top_k, top_p, seed = random_rows(g, b * (k + 1), vocab)
    logits = logits.view(b, k + 1, vocab)
    per_row = lambda t: t.view(b, k + 1)[:, 0].contiguous()  # noqa: E731
    temperature, top_k, top_p, seed = map(per_row, (temperature, top_k, top_p, seed))
    start = torch.randint(0, 2**33, (b,), generator=g)
    tokens, _ = verify_block(logits, torch.zeros(b, k, dtype=torch.int64), start, temperature, top_k, top_p, seed)
    drafts = tokens[:, :k].clone()  # corrupt one slot per row: every acceptance length appears
    cut = torch.randint(0, k + 1, (b,), generator=g)
    rows = (cut < k).nonzero().flatten()
    drafts[rows, cut[rows]] = (drafts[rows, cut[rows]] + 1) % vocab
    want_tokens, want_accepted = verify_block(logits, drafts, start, temperature, top_k, top_p, seed)
    for draft_dtype in (torch.int64, torch.int32):
        got = twin.verify_block_next(logits, drafts.to(draft_dtype), start, temperature, top_k, top_p, seed, 999)
        assert torch.equal(got[0], want_tokens) and torch.equal(got[1], want_accepted)
        assert torch.equal(got[1], cut)
        assert torch.equal(got[2], dispatch.next_block_ids(want_tokens, want_accepted, 999))
        assert (got[2][:, 1:] == 999).all()


def test_twin_rejects_bad_shapes():
    start, temperature, top_k, top_p, seed = params(2)
    with pytest.raises(AssertionError, match="drafts must be"):  # drafts [2, 3] for K = 2
        twin.verify_block_next(torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.int64), start, temperature,
                               top_k, top_p, seed)


# ---------------------------------------------------------------------------------------------
# The CUDA kernels themselves, on emulated thread blocks (twin/cta_emulator.cpp)
# ---------------------------------------------------------------------------------------------

MODES = [(0.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.9, 3, 0.8)]


def misaligned(t: torch.Tensor, offset: int) -> torch.Tensor:
    """The same values in a buffer shifted by `offset` elements (rows lose 16-byte alignment)."""
    flat = torch.empty(t.numel() + offset, dtype=t.dtype)
    flat[offset:] = t.flatten()
    return flat[offset:].view(t.shape)


@pytest.mark.parametrize("vocab,k,offset", [(1, 0, 0), (6, 1, 1), (131, 3, 0), (2053, 1, 1), (4100, 1, 2)])
def test_cuda_kernels_on_emulated_thread_blocks_match_the_twin(vocab, k, offset):
    if host_build.cuda_include_dir() is None:
        pytest.skip("CUDA headers not found (set CUDA_HOME)")
    g = torch.Generator().manual_seed(vocab)
    b = len(MODES)
    logits, _, _, _, _, seed = random_rows(g, b * (k + 1), vocab)
    logits = misaligned(logits.view(b, k + 1, vocab), offset)
    temperature, top_k, top_p = (torch.tensor(c) for c in zip(*MODES))
    args = (logits, torch.randint(0, vocab, (b, k), generator=g), torch.randint(0, 2**40, (b,), generator=g),
            temperature.float(), top_k, top_p.float(), seed[:b].contiguous())
    for got, want in zip(twin.emulated_verify_block_next(*args, 3), twin.verify_block_next(*args, 3)):
        assert torch.equal(got, want)


def test_emulated_kernels_on_adversarial_rows():
    if host_build.cuda_include_dir() is None:
        pytest.skip("CUDA headers not found (set CUDA_HOME)")
    rows = torch.tensor([[NAN] * 6, [NAN, NEG_INF, NAN, NEG_INF, 1.0, 1.0], [NEG_INF] * 6, [-0.0, 0.0, 1e-45, 0, 0, 0]])
    for temperature, top_k, top_p in [(0.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 2, 1.0), (1.0, 0, 0.3), (1.0, 0, 0.0)]:
        args = (rows[:, None, :].contiguous(), torch.zeros(4, 0, dtype=torch.int64),
                *params(4, temperature, top_k, top_p, seed=2**64 - 3))
        assert torch.equal(twin.emulated_verify_block_next(*args)[0], verify_block(*args)[0])


# ---------------------------------------------------------------------------------------------
# nvcc: the kernels compile for every GPU the routes accept (sm_80 .. sm_121 + PTX), warnings as errors
# ---------------------------------------------------------------------------------------------

def finished_nvcc_job(nvcc_job) -> NvccJob:
    if nvcc_job is None or isinstance(nvcc_job, str):
        pytest.skip(nvcc_job or "nvcc not on PATH")
    output = nvcc_job.output()
    assert nvcc_job.proc.returncode == 0, output
    return nvcc_job


@pytest.mark.slow
def test_kernels_compile_for_every_accepted_gpu_without_warnings(nvcc_job):
    output = finished_nvcc_job(nvcc_job).output()
    assert "warning" not in output.lower(), output
    built = archs.library_archs(nvcc_job.fatbin)  # what the fatbin really holds, read from its entry headers
    assert built == archs.DEFAULT, built
    for name, capability in GPUS.items():
        assert archs.covers(built, capability), name


def ptxas_usage(output: str) -> dict[tuple[str, str], dict[str, int]]:
    """{(arch, function): registers, smem, stack, spill_stores, spill_loads} from `nvcc -Xptxas -v` output:
    an entry's lines run "Compiling entry function 'f' for 'sm_90'", "Function properties for f",
    "N bytes stack frame, N bytes spill stores, N bytes spill loads", "Used N registers, ..., N bytes smem";
    a non-inlined device function gets the properties lines only."""
    usage: dict[tuple[str, str], dict[str, int]] = {}
    arch = entry = function = ""
    for line in output.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)' for '(\w+)'", line):
            entry, arch = m.groups()
        elif m := re.search(r"Function properties for (\S+)", line):
            function = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            usage.setdefault((arch, function), {}).update(zip(("stack", "spill_stores", "spill_loads"),
                                                              map(int, m.groups())))
        elif m := re.search(r"Used (\d+) registers", line):
            smem = re.search(r"(\d+) bytes smem", line)
            usage.setdefault((arch, entry), {}).update(registers=int(m[1]), smem=int(smem[1]) if smem else 0)
    return usage


@pytest.mark.slow
def test_kernels_fit_the_register_and_shared_memory_limits_without_spills(nvcc_job):
    """Every kernel on every arch of the list, read from the same compile's ptxas report (MAX_REGISTERS,
    MAX_STATIC_SMEM; no spills, no stack frame)."""
    usage = ptxas_usage(finished_nvcc_job(nvcc_job).output())
    kernels = {(arch, name) for (arch, name), u in usage.items() if "registers" in u}
    assert {arch for arch, _ in kernels} == {f"sm_{a}" for a in archs.SASS}, sorted(kernels)
    for arch in archs.SASS:  # sample_kernel<float, __half, __nv_bfloat16> and accept_kernel
        assert len([name for a, name in kernels if a == f"sm_{arch}"]) == 4, sorted(kernels)
    over = {key: u for key, u in usage.items()
            if u.get("registers", 0) > MAX_REGISTERS or u.get("smem", 0) > MAX_STATIC_SMEM
            or u.get("stack", 0) or u.get("spill_stores", 0) or u.get("spill_loads", 0)}
    assert not over, over


GPUS = {"A100": (8, 0), "A10": (8, 6), "L40S": (8, 9), "H200": (9, 0), "B200": (10, 0), "B300": (10, 3),
        "RTX 5090": (12, 0), "GB10": (12, 1), "Jetson Thor": (11, 0)}


def test_coverage_rules_and_the_old_default():
    """Portable cubins run on later minors of their major, `a` cubins on their GPU only, PTX on anything newer."""
    old = archs.Archs(("90a", "100a", "120a"), ())  # "no kernel image" on these
    assert [n for n, c in GPUS.items() if not archs.covers(old, c)] == ["A100", "A10", "L40S", "B300", "GB10",
                                                                         "Jetson Thor"]
    assert not archs.covers(archs.DEFAULT, (7, 5)) and not archs.covers(archs.DEFAULT, (7, 0))  # T4, V100
    assert archs.covers(archs.Archs(("100f",), ()), (10, 3)) and not archs.covers(archs.Archs(("100f",), ()), (12, 0))
    assert "sm_90a" in archs.uncovered_message("lib.so", old, (8, 0))
    assert "80" in archs.uncovered_message("x", old, (8, 0))


def test_cmake_defaults_are_the_python_list():
    text = (PLUGIN / "CMakeLists.txt").read_text()
    sass = re.search(r'set\(DFLASH_VERIFY_CUDA_ARCHS "([^"]*)"', text).group(1).split(";")
    ptx = re.search(r'set\(DFLASH_VERIFY_PTX_ARCHS "([^"]*)"', text).group(1).split(";")
    assert (tuple(sass), tuple(ptx)) == (archs.SASS, archs.PTX)
    assert archs.cmake_architectures().split(";") == [f"{a}-real" for a in sass] + [f"{a}-virtual" for a in ptx]


@pytest.mark.slow
def test_cmake_finds_tensorrt_through_trt_root_and_fails_loudly_when_required(tmp_path):
    """NVIDIA's Triton TensorRT-LLM images set TRT_ROOT=/usr/local/tensorrt (tensorrtllm_backend
    dockerfile/Dockerfile.triton.trt_llm_backend@8addf2f); -DDFLASH_VERIFY_REQUIRE_TRT=ON must fail without headers."""
    if shutil.which("cmake") is None or shutil.which("nvcc") is None:
        pytest.skip("cmake and nvcc are needed to configure the plugin")
    base = ["cmake", "-S", str(PLUGIN), "-DDFLASH_VERIFY_TORCH=OFF"]
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORRT_ROOT", "TRT_ROOT")}
    if tensorrt_include_dir() is None:
        done = subprocess.run([*base, "-B", str(tmp_path / "a"), "-DDFLASH_VERIFY_REQUIRE_TRT=ON"],
                              capture_output=True, text=True, env=env)
        assert done.returncode != 0 and "TensorRT headers (NvInferRuntime.h) not found" in done.stderr
    root = tmp_path / "tensorrt"
    (root / "include").mkdir(parents=True)
    (root / "include" / "NvInferRuntime.h").write_text("// stands in for TensorRT's header for find_path only\n")
    done = subprocess.run([*base, "-B", str(tmp_path / "b")], capture_output=True, text=True,
                          env={**env, "TRT_ROOT": str(root)})
    assert done.returncode == 0, done.stderr
    assert f"TensorRT headers in {root / 'include'}" in done.stdout
    assert "CUDA architectures " + archs.cmake_architectures() in done.stdout


def tensorrt_include_dir() -> Path | None:
    roots = [os.environ.get("TENSORRT_ROOT"), "/usr", "/usr/local/tensorrt", "/opt/tensorrt"]
    for root in filter(None, roots):
        for inc in (Path(root) / "include", *Path(root).glob("include/*-linux-gnu")):
            if (inc / "NvInferRuntime.h").exists():
                return inc
    return None


def test_tensorrt_plugin_compiles_against_the_tensorrt_headers():
    trt, cuda = tensorrt_include_dir(), host_build.cuda_include_dir()
    if trt is None or cuda is None:
        pytest.skip("TensorRT headers (set TENSORRT_ROOT) or CUDA headers not found")
    cxx = shutil.which("g++") or shutil.which("c++")
    for static in ([], ["-DDFV_TRT_STATIC_REGISTRATION"]):
        cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", *static, f"-isystem{trt}",
               f"-isystem{cuda}", f"-I{PLUGIN / 'include'}", str(PLUGIN / "tensorrt" / "dflash_verify_plugin.cpp")]
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------
# GPU: the CUDA kernel itself (skipped without CUDA and a built torch op)
# ---------------------------------------------------------------------------------------------

def test_top_p_is_exact_at_full_vocab():
    """At Qwen3's V = 151936 with flat logits (many tokens at the nucleus edge) the fixed-point
    top-p rule keeps the same set in the twin and in the torch reference."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 151936, generator=g) * 0.05
    temperature, top_k = torch.ones(6), torch.zeros(6, dtype=torch.int64)
    top_p = torch.tensor([0.9, 0.5, 0.99, 0.1, 0.95, 0.7])
    assert torch.equal(twin.keep_mask(logits, temperature, top_k, top_p),
                       survivors(logits / temperature[:, None], top_k, top_p))
