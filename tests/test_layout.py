"""The house shows the pipeline: top-level folders, one-way imports, file sizes, the packaged templates.

The import order (docs/design-notes.md, "Layout") is checked on the source, every import counted, including
the ones inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dflash_trt"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every dflash_trt module `path` imports (absolute names): `from a import b` counts a.b where that is a
    module, else a (a name defined in a's __init__)."""
    module, found = _module_name(path), set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {name for name in found if name.startswith("dflash_trt")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in _imports(p, set(modules)) if i in modules and i != m} for m, p in modules.items()}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_top_level_is_the_design_card():
    for name in ("pyproject.toml", "dflash_trt", "plugins", "build_configs", "triton_model_repo", "scripts", "tests",
                 "README.md"):
        assert (ROOT / name).exists(), name
    assert not (PACKAGE / "triton" / "model_template").exists()
    assert not (PACKAGE / "spec").exists(), "the algorithm's package is decoding/"


# The packages top to bottom (docs/design-notes.md, "Layout"): a module may import only packages below its own.
# "" is the top-level modules (errors, atomic, tokenizer, host_build). The CPU backend specialises the torch
# backend's runners, so it sits above it; the TensorRT-LLM backend is their sibling.
ORDER = ["cli", "bench", "train", "triton", "runtime", "backends.trtllm", "backends.cpu", "backends.torch", "backends",
         "convert", "engine", "kernels", "model", "decoding", "checkpoint", ""]


def package_of(module: str) -> str:
    """The ORDER entry a module belongs to: the longest one its dotted name starts with."""
    name = module.removeprefix("dflash_trt").lstrip(".")
    return max((p for p in ORDER if p == "" or name == p or name.startswith(p + ".")), key=len)


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import edge from a package to one not below it in ORDER (lazy imports included)."""
    rank = {p: i for i, p in enumerate(ORDER)}
    bad = []
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = package_of(module), package_of(dep)
            if a != b and rank[a] >= rank[b]:
                bad.append(f"{module} -> {dep} ({a or 'top-level'} may not import {b or 'top-level'})")
    return bad


def test_every_package_is_placed_in_the_order():
    packages = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    unplaced = sorted(m for m in packages if package_of(m) == "" and m != "dflash_trt")
    assert unplaced == []


def test_imports_run_down_the_package_order():
    assert violations(_graph()) == []


def test_the_order_check_catches_an_upward_import():
    """An edge against the order is reported, however it is spelled (a lazy import counts as much)."""
    graph = _graph()
    graph["dflash_trt.decoding.sampling"] = graph["dflash_trt.decoding.sampling"] | {"dflash_trt.runtime.scheduler"}
    graph["dflash_trt.backends.torch.runners"] = graph["dflash_trt.backends.torch.runners"] | \
        {"dflash_trt.backends.cpu.ops"}
    found = " | ".join(violations(graph))
    assert len(violations(graph)) == 2, found
    assert "decoding may not import runtime" in found and "backends.torch may not import backends.cpu" in found


@pytest.mark.parametrize("package", sorted({"dflash_trt." + p for p in ORDER if p}))
def test_no_import_circle_inside(package):
    graph = {m: {d for d in deps if _under(d, package)} for m, deps in _graph().items() if _under(m, package)}
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                pytest.fail(f"import circle: {' -> '.join(path[path.index(dep):] + [dep])}")
            if dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("package", ["dflash_trt.triton", "dflash_trt.bench", "dflash_trt.train"])
def test_the_server_and_tools_ask_the_runtime_for_runners(package):
    """The server, the benchmarks and training get runners through the runtime (runtime/backends.py), never
    from a backend directly."""
    bad = {m: sorted(d for d in deps if _under(d, "dflash_trt.backends"))
           for m, deps in _graph().items() if _under(m, package)}
    assert {m: d for m, d in bad.items() if d} == {}


def test_package_files_stay_short():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_pyproject_lists_every_package():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {_module_name(p) for p in PACKAGE.rglob("__init__.py")} | {"dflash_trt.triton_model_repo"}
    assert listed == folders


def _tensors(config: str, kind: str) -> list[tuple[str, str, list[int]]]:
    block = re.search(rf"^{kind} \[(.*?)^\]", config, re.S | re.M).group(1)
    entries = re.findall(r'name: "(\w+)"\s+data_type: (\w+)\s+dims: \[([-\d, ]+)\]', block)
    return [(name, dtype, [int(d) for d in dims.split(",")]) for name, dtype, dims in entries]


@pytest.mark.parametrize("name", ["dflash", "dflash_ar", "ensemble"])
def test_templates_carry_the_protocol_tensors(name):
    from dflash_trt.triton import ensemble, protocol
    from dflash_trt.triton.repository import template

    module = ensemble if name == "ensemble" else protocol
    text = (template(name) / "config.pbtxt").read_text()
    assert _tensors(text, "input") == [tuple(t) for t in module.INPUTS]
    assert _tensors(text, "output") == [tuple(t) for t in module.OUTPUTS]
    required = 1 if name == "ensemble" else 0  # text_input, as in TensorRT-LLM's ensemble
    assert text.count("optional: true") == len(module.INPUTS) - required
    assert f'name: "{name}"' in text and "decoupled: true" in text


def test_rendered_config_fills_every_field(tmp_path):
    from dflash_trt.triton.repository import render_config

    (tmp_path / "manifest.json").write_text("{}")
    manifest = {"block_size": 7, "config": {"runtime": {"max_batch_size": 3, "max_seq_len": 99, "device": "cpu"}}}
    for name, block in (("dflash", "7"), ("dflash_ar", "1")):
        text = render_config(tmp_path, manifest, name, device="cuda:1")
        assert "$" not in text
        for key, value in (("bundle_path", str(tmp_path.resolve())), ("max_batch_size", "3"), ("max_seq_len", "99"),
                           ("device", "cuda:1"), ("block_size", block)):
            assert f'key: "{key}"\n  value: {{ string_value: "{value}" }}' in text


@pytest.mark.slow
def test_wheel_carries_the_model_repository_templates(tmp_path):
    """A wheel built from the repository installs triton_model_repo/ as dflash_trt.triton_model_repo."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("dflash_trt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for model in ("dflash", "dflash_ar"):
        assert f"dflash_trt/triton_model_repo/{model}/config.pbtxt" in names
        assert f"dflash_trt/triton_model_repo/{model}/1/model.py" in names
    assert "dflash_trt/triton_model_repo/README.md" in names
    assert "dflash_trt/triton/python_model.py" in names and "dflash_trt/cli/__init__.py" in names
    assert "dflash_trt/backends/cpu/cpu_kernels/decoder_layer.cpp" in names
    assert "dflash_trt/backends/cpu/cpu_kernels/thread_pool.h" in names
    assert not any(n.startswith("triton_model_repo/") for n in names)
