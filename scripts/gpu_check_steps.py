#!/usr/bin/env python
"""The Python steps of scripts/gpu_check.sh: version checks, one verify-op call, the JSON report.

    python scripts/gpu_check_steps.py versions --out OUT_DIR/versions.json [--dry-run]
    python scripts/gpu_check_steps.py op-call
    python scripts/gpu_check_steps.py report OUT_DIR [--dry-run]

- versions: nvcc's CUDA, the CUDA torch was built with and the newest CUDA the driver supports (nvidia-smi),
  printed side by side; exit 1 at once when they cannot work together: the op is compiled by nvcc against
  torch's headers and libraries, so their CUDA majors must agree (torch's cpp_extension refuses a mismatch),
  and a driver runs code of its own CUDA major or older. A dry run reports the GPU parts as skipped.
- op-call: one `torch.ops.dflash_verify.verify_block` call per logits dtype, rows in every sampling mode,
  checked against the torch reference; what compute-sanitizer runs.
- report: OUT_DIR/gpu_check.json from the steps gpu_check.sh recorded in OUT_DIR/steps.tsv (name, status,
  exit status, detail) and the JSON the steps wrote; exit 1 when a step failed (skipped steps do not count).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DRY_RUN = "skipped: dry run"


def run_text(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def major(version: str | None) -> int | None:
    return int(version.split(".")[0]) if version and version[0].isdigit() else None


def detect_versions(dry_run: bool) -> dict:
    """nvcc, torch and driver CUDA versions (strings, or why there is none)."""
    try:
        import torch
    except ImportError:
        torch = None
    nvcc = re.search(r"release (\d+\.\d+)", run_text(["nvcc", "--version"])) if shutil.which("nvcc") else None
    found = {"nvcc_cuda": nvcc.group(1) if nvcc else "missing: nvcc not on PATH",
             "cmake": "found" if shutil.which("cmake") else "missing: cmake not on PATH",
             "torch": f"missing: {sys.executable} cannot import torch (set PYTHON)", "torch_cuda": "unknown"}
    if torch is not None:
        found.update(torch=torch.__version__, torch_cuda=torch.version.cuda or "none: a CPU build of torch")
    if dry_run:
        return {**found, "driver_cuda": DRY_RUN, "gpu": DRY_RUN}
    if torch is None:
        return {**found, "driver_cuda": "unknown", "gpu": "unknown"}
    smi = re.search(r"CUDA Version:\s*(\d+\.\d+)", run_text(["nvidia-smi"])) if shutil.which("nvidia-smi") else None
    found["driver_cuda"] = smi.group(1) if smi else "unknown: nvidia-smi not found or silent"
    found["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
    return found


def version_problems(v: dict, dry_run: bool) -> list[str]:
    """Why this machine cannot build and run the op (dry run: only what holds without a GPU; without nvcc or
    cmake a dry run skips its build)."""
    nvcc, torch_cuda, driver = major(v["nvcc_cuda"]), major(v["torch_cuda"]), major(v["driver_cuda"])
    needed = ("torch",) if dry_run else ("nvcc_cuda", "cmake", "torch")
    problems = [v[k] for k in needed if v[k].startswith("missing")]
    if nvcc and torch_cuda and nvcc != torch_cuda:
        problems.append(f"nvcc is CUDA {v['nvcc_cuda']} but torch was built with CUDA {v['torch_cuda']}: the op "
                        f"compiles against torch, so the majors must agree (put a CUDA {torch_cuda}.x nvcc first on "
                        f"PATH, or install a torch built for CUDA {nvcc}.x)")
    if dry_run:
        return problems
    if v["torch_cuda"].startswith("none"):
        problems.append(f"torch {v['torch']} is a CPU build: install a CUDA build of torch")
    elif v["gpu"] == "none visible":
        problems.append("torch.cuda.is_available() is False: no visible GPU or driver")
    for name, need in (("nvcc", nvcc), ("torch", torch_cuda)):
        if driver and need and driver < need:
            problems.append(f"the driver supports CUDA {v['driver_cuda']}, older than {name}'s CUDA {need}.x: "
                            "update the driver or use an older CUDA")
    return problems


def cmd_versions(args) -> int:
    found = detect_versions(args.dry_run)
    problems = version_problems(found, args.dry_run)
    for key in ("nvcc_cuda", "torch_cuda", "driver_cuda", "torch", "gpu"):
        print(f"{key:12s} {found[key]}")
    if args.out:
        args.out.write_text(json.dumps({**found, "problems": problems}, indent=2) + "\n")
    for problem in problems:
        print(f"gpu_check: {problem}", file=sys.stderr)
    return 1 if problems else 0


# (temperature, top_k, top_p) of the op-call rows: greedy, sampled, top-k, top-p, top-k + top-p
MODES = ((0.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 50, 1.0), (0.8, 0, 0.9), (0.8, 50, 0.9))


def cmd_op_call(args) -> int:
    """One op call per dtype, a row per sampling mode; V = 4099 leaves rows misaligned and a ragged tail."""
    import torch

    from dflash_trt.decoding.verify import verify_block
    from dflash_trt.kernels import verify as dispatch

    op = dispatch.load_op()
    if op is None or not torch.cuda.is_available():
        print(f"gpu_check: the verify op cannot run: {dispatch.kernel_status()}", file=sys.stderr)
        return 1
    b, k, vocab = len(MODES), 3, 4099
    g = torch.Generator().manual_seed(0)
    temperature, top_k, top_p = (torch.tensor(column) for column in zip(*MODES))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        # made on the host and copied: the op's kernels are the only kernels the sanitizer sees
        host = [(torch.randn(b, k + 1, vocab, generator=g) * 3).to(dtype), torch.randint(0, vocab, (b, k), generator=g),
                torch.arange(b, dtype=torch.int64) * 100, temperature.float(), top_k.long(), top_p.float(),
                torch.randint(-2**63, 2**63 - 1, (b,), generator=g)]
        tokens = op(*[t.cuda() for t in host], 0)[0].cpu()
        if not torch.equal(tokens, verify_block(*host)[0]):
            print(f"gpu_check: op tokens differ from the reference for {dtype}", file=sys.stderr)
            return 1
    print("op call: tokens == reference for fp32, bf16 and fp16 (greedy, sampled, top-k, top-p, both)")
    return 0


STEPS = ("versions", "cmake_build", "torch_op", "tests", "bench", "memcheck", "racecheck", "lossless", "cuda_graphs")


def read_steps(out: Path) -> dict:
    """{step: {status, exit_status, detail}} in STEPS order; a step never recorded did not run."""
    recorded = {}
    tsv = out / "steps.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        name, status, code, detail = line.split("\t", 3)
        recorded[name] = {"status": status, "exit_status": int(code) if code else None, "detail": detail}
    missing = {"status": "skipped", "exit_status": None, "detail": "not run: an earlier step failed"}
    return {name: recorded.get(name, missing) for name in (*STEPS, *recorded)}


def read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def junit_counts(path: Path) -> dict:
    import xml.etree.ElementTree as ET

    if not path.exists():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def build_summary(build_dir: Path) -> dict:
    """What the CMake build left: the TensorRT plugin, the torch op, the fatbin's archs (and, on a GPU,
    whether they cover it)."""
    try:
        import torch

        from dflash_trt.kernels import archs  # the package imports torch
    except ImportError as exc:
        return {"error": f"cannot read the build without torch: {exc}"}
    summary = {name: str(build_dir / lib) if (build_dir / lib).exists() else None
               for name, lib in (("tensorrt_plugin", "libdflash_verify_trt.so"),
                                 ("torch_op", "libdflash_verify_torch.so"), ("fatbin", "verify_kernels.fatbin"))}
    if summary["fatbin"]:
        built = archs.library_archs(build_dir / "verify_kernels.fatbin")
        summary["fatbin_archs"] = {"sass": list(built.sass), "ptx": list(built.ptx)}
        if torch.cuda.is_available():
            summary["fatbin_archs"]["covers_this_gpu"] = archs.covers(built, torch.cuda.get_device_capability())
    return summary


def cmd_report(args) -> int:
    out = args.out_dir
    steps = read_steps(out)
    failed = [name for name, step in steps.items() if step["status"] == "failed"]
    report = {
        "passed": not failed, "failed_steps": failed, "dry_run": args.dry_run, "host": platform.node(),
        "python": sys.executable, "versions": read_json(out / "versions.json"), "steps": steps,
        "build": build_summary(args.build_dir), "tests": junit_counts(out / "pytest.xml"),
        "bench": read_json(out / "bench.json"), "lossless": read_json(out / "lossless.json"),
        "cuda_graphs": read_json(out / "cuda_graphs.json"),
    }
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    width = max(map(len, steps))
    for name, step in steps.items():
        print(f"  {name:{width}s}  {step['status']:7s}  {step['detail']}")
    print(f"wrote {out / 'gpu_check.json'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    versions = sub.add_parser("versions", help="print and check nvcc / torch / driver CUDA versions")
    versions.add_argument("--out", type=Path)
    versions.add_argument("--dry-run", action="store_true")
    sub.add_parser("op-call", help="one verify-op call per dtype (what compute-sanitizer runs)")
    report = sub.add_parser("report", help="write OUT_DIR/gpu_check.json; exit 1 when a step failed")
    report.add_argument("out_dir", type=Path)
    report.add_argument("--build-dir", type=Path, default=ROOT / "plugins" / "dflash_verify" / "build")
    report.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    return {"versions": cmd_versions, "op-call": cmd_op_call, "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
