"""Micro-benchmark of the verify kernel on a CUDA machine; writes a JSON report.

    python scripts/bench_verify.py --out verify_bench.json [--iters 200]

- latency: B=1, K=15 (a 16-token block), V=151936 (Qwen3 vocabulary), per dtype and sampling
  mode, L2-warm (the same logits again) and L2-cold (a 256 MiB write in between), median of
  `iters` CUDA-event timings; the torch reference on the same inputs for comparison;
- read bandwidth: B=64, K=15, V=151936; bytes of logits read once / time, against the peak from
  the device properties (2 * bus width * memory clock) and a measured device-to-device copy;
- agreement: kernel tokens == reference tokens on every benchmark input (a failure for greedy
  and plain sampling; reported only for top-p, where the reference's fp32 masses may move the
  boundary by one token: docs/verify-plugin.md).
Sampling modes: greedy (T=0), sample (T=0.8), topk_topp (T=0.8, top_k=50, top_p=0.9).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dflash_trt.decoding.verify import verify_block as reference_verify  # noqa: E402
from dflash_trt.kernels import verify as dispatch  # noqa: E402

VOCAB, K = 151936, 15
MODES = {"greedy": (0.0, 0, 1.0), "sample": (0.8, 0, 1.0), "topk_topp": (0.8, 50, 0.9)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_inputs(batch: int, dtype: torch.dtype, mode: str, seed: int = 0):
    """Logits [B, K+1, V] shaped like an LLM's (a few large values over a Gaussian floor)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(batch, K + 1, VOCAB, device="cuda", generator=g) * 2.0
    logits[..., :64] += 8.0
    temperature, top_k, top_p = MODES[mode]
    full = lambda v, dt: torch.full((batch,), v, dtype=dt, device="cuda")  # noqa: E731
    drafts = logits[:, :K].argmax(-1)  # greedy drafts: high acceptance in greedy mode
    start = torch.arange(batch, dtype=torch.int64, device="cuda") * 1000 + 17
    seeds = torch.randint(0, 2**62, (batch,), generator=g, device="cuda")
    return (logits.to(dtype), drafts, start, full(temperature, torch.float32), full(top_k, torch.int64),
            full(top_p, torch.float32), seeds)


def time_us(fn, iters: int, flush: torch.Tensor | None = None) -> dict:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()  # evicts the logits from L2
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    samples.sort()
    return {"median": statistics.median(samples), "p10": samples[len(samples) // 10],
            "p90": samples[(9 * len(samples)) // 10]}


def peak_bandwidth_gbs() -> float | None:
    props = torch.cuda.get_device_properties(0)
    bus, clock_khz = getattr(props, "memory_bus_width", 0), getattr(props, "memory_clock_rate", 0)
    return 2 * bus / 8 * clock_khz * 1e3 / 1e9 if bus and clock_khz else None


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src), 20)["median"]
    return 2 * nbytes / (t * 1e-6) / 1e9  # read + write


def run(iters: int) -> dict:
    op = dispatch.load_op()
    if op is None or not torch.cuda.is_available():
        raise SystemExit(f"verify kernel unavailable: {dispatch.kernel_status()}")
    kernel = lambda a: op(*a, 0)  # noqa: E731
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    report: dict = {"device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability()),
                    "torch": torch.__version__, "cuda": torch.version.cuda, "shape": {"K": K, "V": VOCAB},
                    "latency_us": {}, "bandwidth": {}, "mismatches": {}}
    for dname, dtype in DTYPES.items():
        for mode in MODES:
            key = f"{dname}/{mode}"
            args = make_inputs(1, dtype, mode)
            report["latency_us"][key] = {
                "kernel_warm": time_us(lambda: kernel(args), iters),
                "kernel_cold": time_us(lambda: kernel(args), iters, flush),
                "reference_warm": time_us(lambda: reference_verify(*args), max(iters // 10, 5)),
            }
            big = make_inputs(64, dtype, mode, seed=1)
            t = time_us(lambda: kernel(big), max(iters // 4, 10))["median"]
            nbytes = big[0].numel() * big[0].element_size()
            report["bandwidth"][key] = {"batch": 64, "bytes": nbytes, "median_us": t,
                                        "read_gbs": nbytes / (t * 1e-6) / 1e9}
            got = torch.cat([kernel(a)[0].flatten() for a in (args, big)])
            want = torch.cat([reference_verify(*a)[0].flatten() for a in (args, big)])
            report["mismatches"][key] = int((got != want).sum())
    peak = peak_bandwidth_gbs()
    report["peak_bandwidth_gbs"] = {"from_properties": peak, "measured_copy": copy_bandwidth_gbs()}
    for entry in report["bandwidth"].values():
        entry["fraction_of_peak"] = entry["read_gbs"] / peak if peak else None
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("verify_bench.json"))
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    report = run(args.iters)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for key, lat in report["latency_us"].items():
        bw = report["bandwidth"][key]
        print(f"{key:16s} B=1 warm {lat['kernel_warm']['median']:8.1f} us  cold {lat['kernel_cold']['median']:8.1f} us"
              f"  (torch {lat['reference_warm']['median']:8.1f} us)  B=64 {bw['read_gbs']:7.0f} GB/s"
              f"  mismatches {report['mismatches'][key]}")
    print(f"wrote {args.out}")
    exact = {k: v for k, v in report["mismatches"].items() if not k.endswith("topk_topp")}
    return 1 if any(exact.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
