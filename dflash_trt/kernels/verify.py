"""The one switch for verification: the CUDA kernel where it can run, the torch reference elsewhere.

`verify_block` has the signature and results of `dflash_trt.decoding.verify.verify_block`
(tokens [B, K+1], accepted [B]); `verify_block_next` also returns the next block's ids
[B, K+1] = [bonus token t_a, mask_token_id x K]. Which body runs:

- ``reference``: the torch reference in `dflash_trt.decoding` (any device).
- ``kernel``: the CUDA op ``torch.ops.dflash_verify.verify_block`` (CUDA tensors; built by
  scripts/gpu_check.sh or ``python -m dflash_trt.kernels.build_op``); an error if unavailable.
- ``twin``: the kernels' C++ row code compiled for the host (CPU tensors).
- ``auto`` (default): ``kernel`` for CUDA tensors when the op loads; for CPU tensors with sampled rows
  the ``twin`` when it builds (g++ and the plugin sources: a source checkout): one compiled pass per
  row where the torch code runs many tensor ops; else ``reference``.

`sample_tokens` is the same switch for the sampling rule alone (`dflash_trt.decoding.sampling`): the
twin on CPU where it runs, else the torch reference (the CUDA op verifies blocks; single rows on CUDA
use the torch reference).

Choose with ``DFLASH_TRT_VERIFY_IMPL=reference|kernel|twin|auto`` or, in tests, the module-level
``impl_override`` (or the `use_impl` context manager), which wins over the env var. The op
library is ``$DFLASH_TRT_VERIFY_LIB`` when set (that one or none); unset, an op already registered in the
process, else the first library built in plugins/dflash_verify/build.
All implementations give the same tokens bit for bit (docs/verify-plugin.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_trt.decoding import sampling as sampling_rule
from dflash_trt.decoding import verify as reference
from dflash_trt.errors import ConfigError, MissingDependencyError

IMPLS = ("auto", "reference", "kernel", "twin")
ENV_IMPL = "DFLASH_TRT_VERIFY_IMPL"
ENV_LIB = "DFLASH_TRT_VERIFY_LIB"
BUILD_DIR = Path(__file__).resolve().parents[2] / "plugins" / "dflash_verify" / "build"
LIBRARY_CANDIDATES = (BUILD_DIR / "libdflash_verify_torch.so", BUILD_DIR / "torch_ext" / "dflash_verify_torch.so")

impl_override: str | None = None  # tests: set to one of IMPLS (wins over DFLASH_TRT_VERIFY_IMPL)


def selected_impl() -> str:
    """The requested implementation: `impl_override`, else $DFLASH_TRT_VERIFY_IMPL, else 'auto'."""
    name = impl_override or os.environ.get(ENV_IMPL) or "auto"
    if name not in IMPLS:
        raise ConfigError(f"{ENV_IMPL}={name!r} is not one of {', '.join(IMPLS)}")
    return name


@contextlib.contextmanager
def use_impl(name: str):
    """Temporarily force an implementation (tests)."""
    global impl_override
    previous, impl_override = impl_override, name
    try:
        selected_impl()
        yield
    finally:
        impl_override = previous


def _op_registered():
    try:
        return torch.ops.dflash_verify.verify_block
    except (AttributeError, RuntimeError):
        return None


def load_op():
    """The CUDA op, else None (why: `load_error`). When $DFLASH_TRT_VERIFY_LIB names a library, that library
    counts: it is loaded (once per path), and a missing or broken one gives None even if an op of the same name
    is registered already; unset, a registered op is used, else the first library built in BUILD_DIR."""
    return _find_op(os.environ.get(ENV_LIB) or None)[0]


def load_error() -> str | None:
    """Why `load_op()` gives None (None when it gives the op)."""
    return _find_op(os.environ.get(ENV_LIB) or None)[1]


@functools.cache
def _find_op(library: str | None) -> tuple[object | None, str | None]:
    """(op, None) or (None, why not) for $DFLASH_TRT_VERIFY_LIB = `library` (None: unset). Cached per value:
    the dispatch asks on every verify call."""
    if library is None:
        op = _op_registered()
        if op is not None:
            return op, None
        built = [p for p in LIBRARY_CANDIDATES if p.exists()]
        if not built:
            return None, ("no torch op library; on a CUDA machine run scripts/gpu_check.sh or "
                          "`python -m dflash_trt.kernels.build_op`, or set " + ENV_LIB)
        library = str(built[0])
    why = _load_library(Path(library))
    return (None, why) if why else (_op_registered(), None)


def _load_library(path: Path) -> str | None:
    """Load `path` unless torch holds it already; None once it has registered the op, else why not."""
    if not path.is_file():
        return f"{ENV_LIB}={path}: no such file"
    if os.path.realpath(path) not in torch.ops.loaded_libraries:
        # FOOTGUN: a second library defining the dflash_verify namespace aborts the process from its static
        # initializer (torch's "Only a single TORCH_LIBRARY" check throws where nothing can catch it).
        if _op_registered() is not None:
            return (f"not loading {path}: torch.ops.dflash_verify.verify_block is registered already by another "
                    f"library; one process holds one (start a fresh process with {ENV_LIB} set)")
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError) as exc:
            return f"loading {path} failed: {exc}"
    if _op_registered() is None:
        return f"{path} did not register torch.ops.dflash_verify.verify_block"
    return None


def kernel_available() -> bool:
    """True when CUDA is usable and the verify op is loaded (never touches CUDA otherwise)."""
    return torch.cuda.is_available() and load_op() is not None


def kernel_status() -> str:
    """One line saying whether the kernel can run, and if not, why."""
    if not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__})"
    if load_op() is None:
        return load_error() or "torch op not loaded"
    return "kernel available: torch.ops.dflash_verify.verify_block"


_TWIN: dict = {}


def twin_available() -> bool:
    """Whether the host twin builds and loads here (once per process; a failure remembered with its reason)."""
    if "ok" not in _TWIN:
        try:
            from dflash_trt.kernels import twin

            twin.library()
            _TWIN["ok"] = True
        except Exception as exc:  # noqa: BLE001  no compiler, no plugin sources (a wheel), a build error
            _TWIN["ok"], _TWIN["error"] = False, f"{type(exc).__name__}: {exc}"
    return _TWIN["ok"]


def resolve_impl(logits: torch.Tensor, sampled: bool = False) -> str:
    """The implementation that will run for these logits ('reference', 'kernel' or 'twin'); `sampled`:
    some row has temperature > 0 (greedy CPU rows are a plain argmax, fastest in torch)."""
    name = selected_impl()
    if name == "auto":
        if logits.is_cuda:
            return "kernel" if kernel_available() else "reference"
        return "twin" if sampled and twin_available() else "reference"
    if name == "kernel" and not (logits.is_cuda and kernel_available()):
        where = "CPU tensors" if not logits.is_cuda else kernel_status()
        raise MissingDependencyError(f"{ENV_IMPL}=kernel but the CUDA verify kernel cannot run: {where}")
    if name == "twin" and logits.is_cuda:
        raise ConfigError(f"{ENV_IMPL}=twin runs on CPU tensors; got logits on {logits.device}")
    return name


def next_block_ids(tokens: torch.Tensor, accepted: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """[B, K+1] = [t_a, mask_token_id x K]: the bonus token t_a opens the next draft block."""
    out = torch.full_like(tokens, mask_token_id)
    out[:, 0] = tokens.gather(1, accepted[:, None].to(torch.int64))[:, 0]
    return out


def verify_block_next(
    logits: torch.Tensor,  # [B, K+1, V] target logits over [bonus, d_1 .. d_K]
    drafts: torch.Tensor,  # [B, K] int64
    start: torch.Tensor,  # [B] int64: absolute position of the bonus token (block slot 0)
    temperature: torch.Tensor,  # [B] fp32
    top_k: torch.Tensor,  # [B] int64
    top_p: torch.Tensor,  # [B] fp32
    seed: torch.Tensor,  # [B] int64
    mask_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B, K+1], accepted [B] and next_block_ids [B, K+1], from the selected implementation."""
    impl = resolve_impl(logits, bool((temperature > 0).any()))
    if impl == "kernel":
        args = (logits, drafts, start, temperature, top_k, top_p, seed)
        return load_op()(*(a.contiguous() for a in args), mask_token_id)
    if impl == "twin":
        from dflash_trt.kernels import twin

        return twin.verify_block_next(logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id)
    tokens, accepted = reference.verify_block(logits, drafts, start, temperature, top_k, top_p, seed)
    return tokens, accepted, next_block_ids(tokens, accepted, mask_token_id)


def verify_block(
    logits: torch.Tensor,  # [B, K+1, V]
    drafts: torch.Tensor,  # [B, K] int64
    start: torch.Tensor,  # [B] int64
    temperature: torch.Tensor,  # [B] fp32
    top_k: torch.Tensor,  # [B] int64
    top_p: torch.Tensor,  # [B] fp32
    seed: torch.Tensor,  # [B] int64
    sampled: bool | None = None,  # some row has T > 0, when the caller knows (else read from `temperature`)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for `dflash_trt.decoding.verify.verify_block`: tokens [B, K+1] and accepted [B]."""
    sampled = sampling_rule.some_row_samples(temperature, sampled)
    if resolve_impl(logits, sampled) == "reference":  # skip the next-block work
        return reference.verify_block(logits, drafts, start, temperature, top_k, top_p, seed, sampled)
    tokens, accepted, _ = verify_block_next(logits, drafts, start, temperature, top_k, top_p, seed)
    return tokens, accepted


def sample_tokens(logits, positions, temperature, top_k, top_p, seed, vocab_ids=None, sampled=None) -> torch.Tensor:
    """Drop-in for `dflash_trt.decoding.sampling.sample_tokens` (columns [N]): the twin for sampled CPU rows
    where `resolve_impl` picks it, else the torch reference."""
    from dflash_trt.decoding import sampling

    sampled = sampling_rule.some_row_samples(temperature, sampled)
    if not sampled or resolve_impl(logits, True) != "twin":
        return sampling.sample_tokens(logits, positions, temperature, top_k, top_p, seed, vocab_ids, sampled)
    from dflash_trt.kernels import twin

    if vocab_ids is None:
        return twin.sample_tokens(logits, positions, temperature, top_k, top_p, seed)
    # a subset: its columns in ascending token id (each gets its id's noise, ties go to the lowest id), as
    # sampling.by_id orders them; tokens back to the caller's columns
    return sampling.by_id(lambda lg, ids: twin.sample_tokens(lg, positions, temperature, top_k, top_p, seed, ids),
                          logits, vocab_ids)


@dataclass(frozen=True)
class Kernels:
    """The verification and sampling bodies a backend's runners call, chosen once when they are built."""

    name: str  # "kernel" (the CUDA op), "twin" (its C++ twin on CPU) or "reference" (torch)
    verify_block: Callable  # `decoding.verify.verify_block`'s signature and results
    sample_tokens: Callable  # `decoding.sampling.sample_tokens`'s signature and results


def select(device) -> Kernels:
    """The bodies for runners on `device` (the one place that reads $DFLASH_TRT_VERIFY_IMPL / `impl_override`):
    on CUDA the kernel when its op loads, else torch; on CPU the twin for sampled rows when it builds (greedy
    rows are a plain argmax, fastest in torch), else torch. A forced body that cannot run here is an error."""
    from dflash_trt.decoding import sampling

    cuda = torch.device(device).type == "cuda"
    name = selected_impl()
    if name == "auto":
        name = ("kernel" if kernel_available() else "reference") if cuda else \
            ("twin" if twin_available() else "reference")
        greedy_in_torch = not cuda
    else:
        if name == "kernel" and not (cuda and kernel_available()):
            where = "CPU tensors" if not cuda else kernel_status()
            raise MissingDependencyError(f"{ENV_IMPL}=kernel but the CUDA verify kernel cannot run: {where}")
        if name == "twin" and cuda:
            raise ConfigError(f"{ENV_IMPL}=twin runs on CPU tensors; the runners are on {device}")
        greedy_in_torch = False
    if name == "reference":
        return Kernels(name, reference.verify_block, sampling.sample_tokens)
    if name == "kernel":  # the op verifies blocks; single rows (prefill, AR steps) take the torch rule
        return Kernels(name, _kernel_verify, sampling.sample_tokens)
    from dflash_trt.kernels import twin

    def verify(logits, drafts, start, temperature, top_k, top_p, seed, sampled=None):
        if greedy_in_torch and not sampling_rule.some_row_samples(temperature, sampled):
            return reference.verify_block(logits, drafts, start, temperature, top_k, top_p, seed, False)
        return twin.verify_block_next(logits, drafts, start, temperature, top_k, top_p, seed, 0)[:2]

    def sample(logits, positions, temperature, top_k, top_p, seed, vocab_ids=None, sampled=None):
        if greedy_in_torch and not sampling_rule.some_row_samples(temperature, sampled):
            return sampling.sample_tokens(logits, positions, temperature, top_k, top_p, seed, vocab_ids, False)
        return _twin_sample(logits, positions, temperature, top_k, top_p, seed, vocab_ids)

    return Kernels(name, verify, sample)


def _kernel_verify(logits, drafts, start, temperature, top_k, top_p, seed, sampled=None):
    """The op verifies greedy and sampled rows alike (`sampled` is for the other bodies' greedy shortcut)."""
    args = (logits, drafts, start, temperature, top_k, top_p, seed)
    tokens, accepted, _ = load_op()(*(a.contiguous() for a in args), 0)
    return tokens, accepted


def _twin_sample(logits, positions, temperature, top_k, top_p, seed, vocab_ids=None, sampled=None):
    from dflash_trt.decoding import sampling
    from dflash_trt.kernels import twin

    if vocab_ids is None:
        return twin.sample_tokens(logits, positions, temperature, top_k, top_p, seed)
    # a subset: its columns in ascending token id (each gets its id's noise, ties go to the lowest id), as
    # sampling.by_id orders them; tokens back to the caller's columns
    return sampling.by_id(lambda lg, ids: twin.sample_tokens(lg, positions, temperature, top_k, top_p, seed, ids),
                          logits, vocab_ids)
