"""aiperf (NVIDIA's benchmark client, unmodified, its own virtualenv: scripts/setup_aiperf.sh) drives the
OpenAI endpoint of the front before the real tritonserver: every request succeeds, and the text it gets
is local greedy decoding's."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AIPERF = ROOT / os.environ.get("AIPERF_VENV", ".venv-aiperf") / "bin" / "aiperf"
pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not AIPERF.is_file(), reason="aiperf not installed: run scripts/setup_aiperf.sh")]


def test_aiperf_profiles_the_openai_endpoint(front, served, tmp_path):
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.engine.config import ASSETS
    from dflash_trt.tokenizer import stop_token_ids

    pair = served[1]
    prompts = ["def fibonacci(n):\n    ", "import os\nimport ", "class Stack:\n    def push(self, x):\n"]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    out = tmp_path / "aiperf"
    command = [str(AIPERF), "profile", "--model", "dflash", "--url", f"http://{front}", "--endpoint-type", "completions",
               "--streaming", "--tokenizer", str(ASSETS / "tiny-qwen3"), "--input-file", str(dataset),
               "--custom-dataset-type", "single_turn", "--concurrency", "2", "--request-count", "6",
               "--extra-inputs", "max_tokens:16", "--extra-inputs", "temperature:0", "--no-server-metrics",
               "--export-outputs-json", "--artifact-dir", str(out), "--ui", "none"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    assert summary["request_count"]["avg"] == 6 and not summary["error_summary"]
    assert summary["output_token_throughput"]["avg"] > 0
    stops = stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids)
    expected = {}
    for prompt in prompts:
        ids = pair.tokenizer.encode(prompt, add_special_tokens=True)
        tokens = autoregressive_generate(pair.target, [Request(tuple(ids), stop=StopCriteria(16, stops))])[0].tokens
        expected[prompt] = pair.tokenizer.decode(tokens, skip_special_tokens=True)
    outputs = _outputs(out)
    assert len(outputs) == 6
    assert all(text == expected[prompt] for prompt, text in outputs)


def _outputs(out: Path) -> list[tuple[str, str]]:
    """(prompt, generated text) of each request, from aiperf's inputs.json and outputs.json."""
    files = sorted(out.rglob("*outputs*.json"))
    assert files, f"no outputs json under {out}: {sorted(p.name for p in out.rglob('*'))}"
    sent = {s["session_id"]: s["payloads"][0]["prompt"] for s in json.loads((out / "inputs.json").read_text())["data"]}
    return [(sent[r["conversation_id"]], r["response_text"]) for r in json.loads(files[0].read_text())["data"]]
