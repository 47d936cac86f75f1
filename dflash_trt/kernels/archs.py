"""The GPUs the DFlashVerify kernels are compiled for, and whether a built library covers a GPU.

One list for every consumer: plugins/dflash_verify/CMakeLists.txt (its default, checked by a test),
the CI nvcc compile, `scripts/gpu_check.sh`, `dflash-trt build` (backend trtllm) and `dflash-trt doctor`.

- SASS for every GPU generation either route accepts: A100 (80), A10 / RTX 30 (86), L40S / RTX 40 (89),
  H100 / H200 (90), B200 / GB200 (100), B300 / GB300 (103), RTX 50 / RTX PRO (120), GB10 / DGX Spark (121).
  The kernels use nothing arch-specific, so the portable targets (sm_90, not sm_90a) are right;
  arch-specific `a` cubins run on that exact GPU only (a 90a;100a;120a list gives "no kernel image" on
  A100, L40S, B300, GB10).
- PTX of the lowest one (compute_80): the driver JIT-compiles it on any newer GPU no cubin matches
  (Jetson Orin 87, Thor 110, what comes next).

A portable cubin runs on GPUs of the same major version and an equal or higher minor (sm_80 code on
an sm_86 GPU), a family cubin (sm_100f) likewise within its family, an arch-specific one (sm_90a) on
that exact GPU only; PTX runs on any GPU of equal or higher compute capability (CUDA C Programming
Guide, "Binary Compatibility", "PTX Compatibility", "Feature Availability"). `covers` encodes those
rules; `library_archs` reads what a built file really holds from its embedded fatbin headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SASS = ("80", "86", "89", "90", "100", "103", "120", "121")
PTX = ("80",)
FATBIN_MAGIC = 0xBA55ED50  # fatbin container header: magic u32, version u16, header size u16, size u64
ENTRY_PTX, ENTRY_ELF = 1, 2  # fatbin entry kinds


ARCH_SPECIFIC, FAMILY = 1 << 20, 1 << 21  # entry flags (u64 at +40): sm_90a, sm_100f


@dataclass(frozen=True)
class Archs:
    sass: tuple[str, ...]  # cubins: "80", "90a" (arch-specific), "100f" (family)
    ptx: tuple[str, ...]  # PTX the driver can JIT: "80"

    def describe(self) -> str:
        return ", ".join([f"sm_{a}" for a in self.sass] + [f"compute_{a} (PTX)" for a in self.ptx]) or "none"


DEFAULT = Archs(SASS, PTX)


def _number(arch: str) -> int:
    return int(arch.rstrip("af"))


def capability_number(capability: tuple[int, int]) -> int:
    """(9, 0) -> 90, (12, 1) -> 121."""
    return capability[0] * 10 + capability[1]


def covers(archs: Archs, capability: tuple[int, int]) -> bool:
    """Can a GPU of `capability` run code from `archs` (a matching cubin, or PTX to JIT)?"""
    major, minor = capability
    for arch in archs.sass:
        number = _number(arch)
        if arch.endswith("a"):
            if number == capability_number(capability):
                return True
        elif number // 10 == major and number % 10 <= minor:
            return True
    return any(_number(a) <= capability_number(capability) for a in archs.ptx)


def cmake_architectures(archs: Archs = DEFAULT) -> str:
    """CMake CUDA_ARCHITECTURES spelling: '80-real;86-real;...;80-virtual'."""
    return ";".join([f"{a}-real" for a in archs.sass] + [f"{a}-virtual" for a in archs.ptx])


def gencode_flags(archs: Archs = DEFAULT) -> list[str]:
    """nvcc -gencode flags: one cubin per SASS arch, PTX for the PTX ones."""
    return ([f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs.sass]
            + [f"-gencode=arch=compute_{a},code=compute_{a}" for a in archs.ptx])


def fatbin_archs(data: bytes) -> Archs:
    """The cubin and PTX archs of every fatbin container embedded in `data` (a .fatbin, .so or .o).

    Each container: header (magic, version 1, header size, payload size), then entries, each with
    kind u16 (1 PTX, 2 ELF) at +0, its header size u32 at +4, payload size u64 at +8, the arch u32
    at +28 and flags u64 at +40 (what `nvcc -fatbin` writes; a CPU test parses nvcc's own output)."""
    sass, ptx = set(), set()
    magic = struct.pack("<I", FATBIN_MAGIC)
    at = data.find(magic)
    while at >= 0:
        if at + 16 <= len(data):
            _, version, header, size = struct.unpack_from("<IHHQ", data, at)
            entry, end = at + header, min(at + header + size, len(data))
            while version == 1 and entry + 32 <= end:
                kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
                arch = struct.unpack_from("<I", data, entry + 28)[0]
                flags = struct.unpack_from("<Q", data, entry + 40)[0] if entry_header >= 48 else 0
                name = f"{arch}{'a' if flags & ARCH_SPECIFIC else 'f' if flags & FAMILY else ''}"
                (ptx if kind == ENTRY_PTX else sass if kind == ENTRY_ELF else set()).add(name)
                if entry_header == 0:
                    break
                entry += entry_header + payload
        at = data.find(magic, at + 4)
    return Archs(tuple(sorted(sass, key=_number)), tuple(sorted(ptx, key=_number)))


def library_archs(path: str | Path) -> Archs:
    """What a built kernel library (the TensorRT plugin, the torch op, a fatbin) holds."""
    return fatbin_archs(Path(path).read_bytes())


def uncovered_message(what: str, archs: Archs, capability: tuple[int, int]) -> str:
    return (f"{what} has kernels for {archs.describe()}, none of which runs on this GPU "
            f"(compute capability {capability[0]}.{capability[1]}); rebuild it with the default architectures "
            f"(cmake -S plugins/dflash_verify -B plugins/dflash_verify/build; docs/verify-plugin.md) or add "
            f"-DDFLASH_VERIFY_CUDA_ARCHS=...;{capability_number(capability)}")
