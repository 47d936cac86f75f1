"""The house shows the pipeline: top-level folders, one-way imports, file sizes, the packaged templates.

The import rules (docs/design-notes.md, "Layout") are checked on the source, every import counted,
including the ones inside functions: a lazy import is still a dependency.
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


def _imports(path: Path) -> set[str]:
    """Every dflash_trt module `path` imports (absolute names; `from a import b` counts a and a.b)."""
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
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("dflash_trt")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_top_level_is_the_design_card():
    for name in ("pyproject.toml", "dflash_trt", "plugins", "build_configs", "triton_model_repo", "scripts", "tests",
                 "README.md"):
        assert (ROOT / name).exists(), name
    assert not (PACKAGE / "triton" / "model_template").exists()
    assert not (PACKAGE / "spec").exists(), "the algorithm's package is decoding/"


def test_nothing_below_the_cli_imports_it():
    offenders = {m: sorted(i for i in deps if _under(i, "dflash_trt.cli"))
                 for m, deps in _graph().items() if not _under(m, "dflash_trt.cli")}
    assert {m: d for m, d in offenders.items() if d} == {}


@pytest.mark.parametrize("package", ["dflash_trt.model", "dflash_trt.decoding", "dflash_trt.checkpoint",
                                     "dflash_trt.engine", "dflash_trt.runtime", "dflash_trt.triton"])
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


@pytest.mark.parametrize("package", ["dflash_trt.triton", "dflash_trt.engine"])
def test_server_and_engine_do_not_import_a_backend(package):
    """The server asks runtime/backends.py for runners; engine/ defines the build contract a backend fills."""
    bad = {m: sorted(d for d in deps if _under(d, "dflash_trt.trtllm"))
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
    assert "dflash_trt/model/cpu_kernels/decoder_layer.cpp" in names
    assert not any(n.startswith("triton_model_repo/") for n in names)
