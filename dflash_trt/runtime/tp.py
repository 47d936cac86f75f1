"""Tensor-parallel decoding: N processes, one rank each, every one running the engine over its shard.

Rank r builds its shard of a converted pair (backends/torch/parallel.py: local dims, parallel modules)
and decodes the same requests through the same runners and scheduler as a single process would; the
all-reduces inside the models keep every rank's residual stream, taps and logits equal, so every rank
makes the same decisions. `tp_generate` checks that all ranks agree and returns rank 0's results.
Backend: gloo on CPU, nccl with one GPU per rank.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

if dist.is_available():
    import torch.distributed.nn  # noqa: F401  (before any init_process_group: see init_tp)

from dflash_trt.backends.torch.parallel import load_trtllm_pair
from dflash_trt.decoding.requests import GenerationResult, Request
from dflash_trt.runtime.generate import capacity_for
from dflash_trt.runtime.local import generate, local_engine


@dataclass(frozen=True)
class TPJob:
    """One decode run on every rank: a converted pair and the requests to decode with it."""

    target_dir: str
    draft_dir: str
    requests: tuple[Request, ...]
    block_size: int | None = None
    simulate: bool = True
    dtype: str = "auto"
    # > 0: a prefix cache of this many bytes on every rank, and the requests decoded one after another, as a
    # session's turns (a later one restores the blocks an earlier one left); every rank keeps the same blocks
    prefix_cache_bytes: int = 0


def init_tp(rank: int, world: int, init_file: Path) -> str:
    """Join the process group (nccl with one GPU per rank, else gloo); returns this rank's device.

    torch.distributed.nn.functional binds `group=group.WORLD` as default arguments when imported. Imported
    after this call (building a module under torch.device("meta") imports torch._dynamo, which imports it),
    those defaults hold the default group, so destroy_process_group() frees nothing and gloo's worker threads
    live into interpreter finalization, where one dropping its last work must take the GIL and is killed by
    pthread_exit: SIGABRT, "terminate called without an active exception". This module imports it first,
    so the defaults are None and destroy really ends gloo."""
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    if cuda:
        torch.cuda.set_device(rank)
        return f"cuda:{rank}"
    torch.set_num_threads(1)  # tp processes share the CPU cores; more threads only oversubscribe
    return "cpu"


def _worker(rank: int, world: int, folder: str, jobs: list[TPJob]) -> None:
    device = init_tp(rank, world, Path(folder) / "init")
    try:
        out = []
        for job in jobs:
            pair = load_trtllm_pair(job.target_dir, job.draft_dir, rank, job.dtype, device, job.simulate)
            # widths from a fixed schedule: measured ones would follow each rank's own timings, and ranks that
            # verify different widths would no longer run the same collectives
            if job.prefix_cache_bytes:
                engine = local_engine(pair, capacity_for(list(job.requests)), job.block_size, width_policy="schedule",
                                      max_batch_size=1, prefix_cache_bytes=job.prefix_cache_bytes)
                results = [engine.generate([request])[0] for request in job.requests]
            else:
                results, _ = generate(pair, list(job.requests), job.block_size, width_policy="schedule")
            out.append([asdict(r) for r in results])
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def tp_generate(jobs: list[TPJob], tp: int) -> list[list[GenerationResult]]:
    """Run every job on `tp` spawned ranks; all ranks must agree; returns rank 0's results per job."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(tp, folder, jobs), nprocs=tp, join=True)
        per_rank = [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(tp)]
    if any(other != per_rank[0] for other in per_rank[1:]):
        raise RuntimeError("tensor-parallel ranks disagree on the generated tokens")
    return [[GenerationResult(**r) for r in job] for job in per_rank[0]]
