"""What a crash or a mistaken output path must never do to artifacts: build, publish, train-draft.

- a build / publish / train-draft output that names a folder this tool did not write is refused,
  nothing in it touched (`output: .` once deleted the YAML it was in);
- a publish killed midway leaves nothing inside the repository (temporaries live beside it) and
  the next publish removes its leftovers; an old model a kill left only as `.old-*` is put back;
- the server's repository scan ignores leftovers of older versions instead of failing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from dflash_trt import atomic
from dflash_trt.engine.config import load_build_config
from dflash_trt.errors import ConfigError
from dflash_trt.runtime.build import build
from dflash_trt.triton.repository import publish
from dflash_trt.triton.server import repository_models


def _config(folder: Path, tiny_pair, output: str) -> Path:
    data = {"name": "tiny-random", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]), "backend": "torch",
            "dtype": "fp32", "block_size": 4, "runtime": {"device": "cpu", "max_batch_size": 2, "max_seq_len": 64},
            "golden": {"prompts": [{"token_ids": [1, 2, 3]}], "max_new_tokens": 4}, "output": output,
            "repository": "repo"}
    path = folder / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_pair):
    folder = tmp_path_factory.mktemp("bundle")
    path, _, _ = build(load_build_config(_config(folder, tiny_pair, "bundle")), log=lambda m: None)
    return path


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("output", [".", "notes"])
def test_build_refuses_an_output_folder_it_did_not_write(tmp_path, tiny_pair, output):
    config = _config(tmp_path, tiny_pair, output)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    before = _tree(tmp_path)
    with pytest.raises(ConfigError) as err:
        build(load_build_config(config), log=lambda m: None)
    message = err.value.format_message()
    assert str((tmp_path / output).resolve()) in message and "field 'output'" in message and "refusing" in message
    assert _tree(tmp_path) == before  # the YAML itself included


def test_build_replaces_its_own_bundle(tmp_path, tiny_pair):
    config = _config(tmp_path, tiny_pair, "bundle")
    first, _, _ = build(load_build_config(config), log=lambda m: None)
    (first / "stray.txt").write_text("x")  # a changed bundle is rebuilt over, being ours
    second, manifest, reused = build(load_build_config(config), log=lambda m: None)
    assert second == first and not reused and not (second / "stray.txt").exists()
    assert not atomic.leftovers(tmp_path)


def test_publish_refuses_a_model_folder_it_did_not_write(tmp_path, bundle):
    repo = tmp_path / "repo"
    (repo / "dflash" / "1").mkdir(parents=True)
    (repo / "dflash" / "config.pbtxt").write_text('name: "dflash"\nbackend: "onnxruntime"\n')
    before = _tree(repo)
    with pytest.raises(ConfigError, match="not a Triton model published by dflash-trt"):
        publish(bundle, repo)
    assert _tree(repo) == before


def test_republish_keeps_nothing_inside_the_repository(tmp_path, bundle):
    repo = publish(bundle, tmp_path / "repo")
    publish(bundle, repo)  # replaces both models
    assert sorted(p.name for p in repo.iterdir()) == ["dflash", "dflash_ar", "ensemble"]
    assert repository_models(repo) == (["dflash", "dflash_ar", "ensemble"], [])


KILLED_PUBLISH = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dflash_trt import atomic
    from dflash_trt.triton.repository import is_published_model
    repo = Path(sys.argv[1])
    def fill(tmp):
        (tmp / "config.pbtxt").write_text('key: "bundle_manifest_sha256"')
        print("filling", flush=True)
        time.sleep(60)
    atomic.write_atomically(repo / "dflash", fill, owned=is_published_model, scratch=atomic.repository_scratch(repo))
""")


def test_killed_publish_leaves_nothing_in_the_repository_and_is_cleaned_next_time(tmp_path, bundle):
    repo = publish(bundle, tmp_path / "repo")
    before = _tree(repo)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_PUBLISH, str(repo)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "filling"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    scratch = atomic.repository_scratch(repo)
    assert _tree(repo) == before and len(atomic.leftovers(scratch)) == 1  # the temp sits beside the repository
    assert repository_models(repo) == (["dflash", "dflash_ar", "ensemble"], [])
    publish(bundle, repo)
    assert atomic.leftovers(scratch) == [] and repository_models(repo)[1] == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_model_left_only_as_old_by_a_kill_is_put_back(tmp_path):
    out = tmp_path / "repo" / "dflash"
    scratch = atomic.repository_scratch(tmp_path / "repo")
    old = scratch / f".dflash.old-{_dead_pid()}-abc"
    old.mkdir(parents=True)
    (old / "config.pbtxt").write_text("previous")
    (tmp_path / "repo").mkdir()
    atomic.remove_stale(scratch, "dflash", out)
    assert (out / "config.pbtxt").read_text() == "previous" and not old.exists()


def test_leftovers_of_live_writers_are_kept(tmp_path):
    live = tmp_path / f".dflash.tmp-{os.getpid()}-xyz"
    live.mkdir()
    dead = tmp_path / f".dflash.tmp-{_dead_pid()}-xyz"
    dead.mkdir()
    assert atomic.remove_stale(tmp_path, "dflash") == [dead] and live.exists()


def test_server_scan_ignores_leftovers_of_older_publishes(tmp_path, bundle):
    repo = publish(bundle, tmp_path / "repo")
    names = (f".dflash.tmp-{_dead_pid()}-ab", f".dflash_ar.old-{_dead_pid()}")
    for name in names:  # where versions before this one left them
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text((repo / "dflash" / "config.pbtxt").read_text())
    (repo / "notes.txt").write_text("x")
    assert repository_models(repo) == (["dflash", "dflash_ar", "ensemble"], [*names, "notes.txt"])
    publish(bundle, repo)  # and a publish removes them (their writers are gone)
    assert repository_models(repo) == (["dflash", "dflash_ar", "ensemble"], ["notes.txt"])


def test_train_draft_refuses_a_foreign_output_before_training(tmp_path, tiny_pair):
    from dflash_trt.train.trainer import TrainDraftConfig, train_draft

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "weights.bin").write_bytes(b"\0")
    data = tmp_path / "data.jsonl"
    data.write_text('{"token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}\n')
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="not a drafter folder this tool wrote"):
        train_draft(TrainDraftConfig(target=str(tiny_pair[0]), data=[str(data)], out=str(tmp_path / "mine"), steps=5))
    assert time.perf_counter() - t0 < 5 and (tmp_path / "mine" / "weights.bin").read_bytes() == b"\0"
    assert not Path(f"{tmp_path / 'mine'}.train-state").exists()


def _copy(bundle: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(bundle, tmp_path / "copy"))


def _edit_manifest(bundle: Path, change) -> None:
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


@pytest.mark.parametrize("how", ["field", "rehashed-weights", "unlisted-file"])
def test_an_edited_bundle_is_refused(tmp_path, bundle, how):
    from dflash_trt.engine.bundle import sha256_file, verify_bundle
    from dflash_trt.errors import CheckpointError

    copy = _copy(bundle, tmp_path)
    verify_bundle(copy)
    if how == "field":
        _edit_manifest(copy, lambda m: m["config"]["runtime"].update(max_seq_len=10**9))
        fragment = "edited after the build"
    elif how == "rehashed-weights":
        weights = copy / "target" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
        _edit_manifest(copy, lambda m: m["files"]["target/model.safetensors"].update(sha256=sha256_file(weights)))
        fragment = "edited after the build"
    else:
        (copy / "draft" / "extra.safetensors").write_bytes(b"x")
        fragment = "not listed in manifest.json"
    with pytest.raises(CheckpointError, match=fragment):
        verify_bundle(copy)


def test_the_server_loads_only_the_manifest_it_was_published_from(tmp_path, bundle):
    import hashlib

    from dflash_trt.engine.bundle import verify_published
    from dflash_trt.errors import CheckpointError

    digest = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    assert verify_published(bundle, digest)["name"] == "tiny-random"
    with pytest.raises(CheckpointError, match="publish` again"):
        verify_published(bundle, "0" * 64)
