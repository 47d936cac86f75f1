"""Micro-benchmark of the verify kernel on a CUDA machine; writes a JSON report.

    python scripts/bench_verify.py --out verify_bench.json [--iters 200]

- latency: B=1, K=15 (a 16-token block), V=151936 (Qwen3 vocabulary), per dtype and sampling
  mode, L2-warm (the same logits again) and L2-cold (a 256 MiB write in between), median of
  `iters` CUDA-event timings; the torch reference on the same inputs for comparison;
- read bandwidth: B=64, K=15, V=151936; bytes of logits read once / time;
- HBM share: bytes of logits / (time x peak HBM bandwidth), for B=1 L2-cold and B=64; the peak is the
  datasheet figure for the device name where PEAK_HBM_GBS has it (H200: 4.8 TB/s), else 2 * bus width *
  memory clock from the device properties; the report says which, beside a measured device-to-device copy;
- agreement: kernel tokens == reference tokens on every benchmark input, top-p included (the kernel and
  the reference share one fixed-point top-p mass: docs/verify-plugin.md); any mismatch is exit status 1.
Sampling modes: greedy (T=0), sample (T=0.8), topk_topp (T=0.8, top_k=50, top_p=0.9).
"""

from __future__ import annotations

import argparse
import json
import re
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
# Peak memory bandwidth, GB/s, from NVIDIA's datasheets, by a word of torch.cuda.get_device_name() (GH200 is
# not an H200); the first match wins, so a variant precedes its family ("H100 NVL" before "H100", the SXM part).
PEAK_HBM_GBS = (("H200", 4800), ("B200", 8000), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350),
                ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555), ("L40S", 864))


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


def properties_bandwidth_gbs() -> float | None:
    props = torch.cuda.get_device_properties(0)
    bus, clock_khz = getattr(props, "memory_bus_width", 0), getattr(props, "memory_clock_rate", 0)
    return 2 * bus / 8 * clock_khz * 1e3 / 1e9 if bus and clock_khz else None


def peak_bandwidth(name: str, from_properties: float | None) -> tuple[float | None, str]:
    """(GB/s, where the figure comes from) for the device called `name`."""
    for part, gbs in PEAK_HBM_GBS:
        if re.search(rf"\b{re.escape(part)}\b", name):
            return float(gbs), f"datasheet ({part})"
    return from_properties, "device properties (2 x bus width x memory clock)"


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
            report["latency_us"][key]["bytes"] = args[0].numel() * args[0].element_size()
            big = make_inputs(64, dtype, mode, seed=1)
            t = time_us(lambda: kernel(big), max(iters // 4, 10))["median"]
            nbytes = big[0].numel() * big[0].element_size()
            report["bandwidth"][key] = {"batch": 64, "bytes": nbytes, "median_us": t,
                                        "read_gbs": nbytes / (t * 1e-6) / 1e9}
            got = torch.cat([kernel(a)[0].flatten() for a in (args, big)])
            want = torch.cat([reference_verify(*a)[0].flatten() for a in (args, big)])
            report["mismatches"][key] = int((got != want).sum())
    from_properties = properties_bandwidth_gbs()
    peak, source = peak_bandwidth(report["device"], from_properties)
    report["peak_bandwidth_gbs"] = {"used": peak, "source": source, "from_properties": from_properties,
                                    "measured_copy": copy_bandwidth_gbs()}
    report["hbm_share"] = {key: hbm_share(report["latency_us"][key], report["bandwidth"][key], peak)
                           for key in report["latency_us"]}
    return report


def hbm_share(latency: dict, bandwidth: dict, peak_gbs: float | None) -> dict:
    """Bytes of logits read / (kernel time x peak bandwidth): B=1 with the logits out of L2, and B=64."""
    if not peak_gbs:
        return {"b1_cold": None, "b64": None}
    share = lambda nbytes, us: nbytes / (us * 1e-6 * peak_gbs * 1e9)  # noqa: E731
    return {"b1_cold": share(latency["bytes"], latency["kernel_cold"]["median"]),
            "b64": share(bandwidth["bytes"], bandwidth["median_us"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("verify_bench.json"))
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    report = run(args.iters)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    peak = report["peak_bandwidth_gbs"]
    print(f"peak HBM bandwidth {peak['used'] or float('nan'):.0f} GB/s ({peak['source']})")
    for key, lat in report["latency_us"].items():
        bw, share = report["bandwidth"][key], report["hbm_share"][key]
        print(f"{key:16s} B=1 warm {lat['kernel_warm']['median']:8.1f} us  cold {lat['kernel_cold']['median']:8.1f} us"
              f"  (torch {lat['reference_warm']['median']:8.1f} us)  B=64 {bw['read_gbs']:7.0f} GB/s"
              f"  HBM share B=1 cold {percent(share['b1_cold'])} B=64 {percent(share['b64'])}"
              f"  mismatches {report['mismatches'][key]}")
    print(f"wrote {args.out}")
    return 1 if any(report["mismatches"].values()) else 0


def percent(x: float | None) -> str:
    return f"{100 * x:5.1f}%" if x is not None else "  n/a"


if __name__ == "__main__":
    sys.exit(main())
