#!/usr/bin/env python3
"""Seeded hostile requests against a real `dflash-trt serve` on loopback: crashes, hangs, wrong answers.

    python scripts/fuzz_serve.py --requests 2000 --seed 0 --faults 2 --out out/reliability/fuzz.json

Every request is one of the classes below (HTTP through the front, gRPC straight to Triton), drawn
with a seeded generator; after each, `serve` must be alive and, but for injected faults, its server
the same process. A request that takes longer than --timeout is a hang. `--faults N` also kills a
model process N times (kill -9) and times the recovery. At the end the canary request's tokens must
equal those before the run. Bounded in count and time (--max-seconds); loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import time
import urllib.error
import urllib.request
from collections import Counter

import numpy as np
from serve_harness import (
    RssSampler,
    Served,
    add_common_args,
    build_repository,
    canary_tokens,
    request_inputs,
    write_report,
)

TEXT = "def main(argv):\n"


def http(served: Served, path: str, raw: bytes, timeout: float, method: str = "POST", headers=None):
    request = urllib.request.Request(f"http://{served.http}{path}", data=raw, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


def body(rng: random.Random, **fields) -> bytes:
    return json.dumps(request_inputs(TEXT, max_tokens=rng.randint(1, 16), stream=False) | fields).encode()


def case_deep_json(rng, served, t):
    n = rng.choice([40, 1000, 100_000, 300_000])
    return http(served, rng.choice(["/v2/models/dflash/generate", "/v2/models/dflash/infer"]),
                b'{"text_input": ' + b"[" * n + b"]" * n + b"}", t)


def case_huge_body(rng, served, t):
    return http(served, "/v2/models/dflash/generate", b'{"text_input": "' + b"a" * rng.randint(9 << 20, 12 << 20) + b'"}', t)


def case_big_prompt(rng, served, t):  # under the body limit, over what max_seq_len tokens can hold
    return http(served, "/v2/models/dflash/generate", body(rng, text_input="x" * rng.randint(1 << 20, 7 << 20)), t)


def case_bad_type(rng, served, t):
    name = rng.choice(["max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stop_words", "input_ids"])
    value = rng.choice(["7", None, [1, [2]], {"a": 1}, True, 1.5, -3, "", [], "\ud800"])
    return http(served, "/v2/models/dflash/generate", body(rng, **{name: value}), t)


def case_out_of_range(rng, served, t):
    name, value = rng.choice([("max_tokens", 4294967300), ("max_tokens", -1), ("seed", -1), ("seed", 2**64),
                              ("top_k", 2**40), ("input_ids", [1, 2**33]), ("temperature", 1e400), ("top_p", 5.0),
                              ("max_tokens", 10**6)])
    return http(served, "/v2/models/dflash/generate", body(rng, **{name: value}).replace(b"Infinity", b"1e999"), t)


def case_unknown_field(rng, served, t):
    # misspellings and fields nobody serves (bad_words, end_id and random_seed became real fields: not here)
    return http(served, "/v2/models/dflash/generate", body(rng, **{rng.choice(["max_token", "randomseed", "Stream",
                                                                            "temprature", "beam_width"]): 1}), t)


def case_stop_words(rng, served, t):
    n, length = rng.choice([(65, 3), (5000, 3), (3, 600), (64, 512)])
    words = ["".join(rng.choice("abcxyz") for _ in range(length)) for _ in range(n)]
    return http(served, "/v2/models/dflash/generate", body(rng, stop_words=words), t)


def case_garbage(rng, served, t):
    raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 4000)))
    path = rng.choice(["/v2/models/dflash/generate", "/v2/models/dflash/generate_stream", "/v2/models/x/infer",
                       "/v2/repository/index", "/v1/completions", "/%00", "/v2/models/dflash/versions/9/generate"])
    return http(served, path, raw, t, method=rng.choice(["POST", "PUT", "GET", "DELETE"]))


def case_binary_header(rng, served, t):
    return http(served, "/v2/models/dflash/infer", b'{"inputs": []}' + os.urandom(64), t,
                headers={"Inference-Header-Content-Length": rng.choice(["14", "999999", "-1", "x"])})


def case_disconnect(rng, served, t):
    path = rng.choice(["generate", "generate_stream"])
    raw = json.dumps(request_inputs(TEXT, max_tokens=300, ignore_eos=True, stream=path.endswith("stream"))).encode()
    with socket.create_connection(("127.0.0.1", served.ports.http), timeout=t) as sock:
        sock.sendall(f"POST /v2/models/dflash/{path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
                     + raw)
        time.sleep(rng.random() * 0.3)
    return "closed"


def _grpc(served, inputs: dict, t: float, model: str = "dflash", cancel_after: float | None = None):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(served.grpc)
    done, outcome = [], {}

    def callback(result, error):
        outcome.setdefault("first", "error" if error else "ok")
        if error is not None or result.as_numpy("finish_reason").reshape(-1)[0]:
            done.append(1)

    client.start_stream(callback=callback)
    tensors = []
    for name, (array, dtype) in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    client.async_stream_infer(model, tensors)
    deadline = time.monotonic() + (cancel_after if cancel_after is not None else t)
    while not done and time.monotonic() < deadline:
        time.sleep(0.005)
    client.stop_stream(cancel_requests=True)
    client.close()
    if cancel_after is not None:
        return "cancelled"
    return outcome.get("first", "hang") if done else "hang"


def case_grpc_malformed(rng, served, t):
    text = np.array([TEXT.encode()], dtype=object)
    cases = [
        {"text_input": (text.reshape(1, 1), "BYTES"), "max_tokens": (np.array([[4]], dtype=np.int32), "INT32")},
        {"text_input": (text, "BYTES"), "temperature": (np.array([1], dtype=np.int32), "INT32")},
        {"text_input": (np.array([b"\xff\xfe"], dtype=object), "BYTES")},
        {"input_ids": (np.array([1, 99999], dtype=np.int32), "INT32")},
        {"input_ids": (np.arange(1, 100_001, dtype=np.int32) % 1000 + 1, "INT32")},
        {"text_input": (text, "BYTES"), "temperature": (np.array([np.nan], dtype=np.float32), "FP32")},
        {"text_input": (text, "BYTES"), "top_k": (np.array([-5], dtype=np.int32), "INT32")},
        {"max_tokens": (np.array([4], dtype=np.int32), "INT32")},
        {"text_input": (text, "BYTES"), "stop_words": (np.array([b"x"] * 100, dtype=object), "BYTES")},
        {"text_input": (np.array(["x" * (3 << 20)], dtype=object), "BYTES")},
    ]
    return _grpc(served, rng.choice(cases), t)


def case_grpc_cancel(rng, served, t):
    inputs = {"text_input": (np.array([TEXT.encode()], dtype=object), "BYTES"),
              "max_tokens": (np.array([300], dtype=np.int32), "INT32"), "stream": (np.array([True]), "BOOL"),
              "ignore_eos": (np.array([True]), "BOOL")}
    return _grpc(served, inputs, t, model=rng.choice(["dflash", "dflash_ar"]), cancel_after=rng.random() * 0.3)


CASES = {name.removeprefix("case_"): fn for name, fn in globals().items() if name.startswith("case_")}


def inject_fault(served: Served, rng: random.Random) -> float:
    """kill -9 one model process; seconds until a canary succeeds again."""
    server, pid = served.server_pid(), served.model_pid(rng.choice(["dflash", "dflash_ar"]))
    t0 = time.monotonic()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    while served.server_pid() in (server, None) and time.monotonic() - t0 < 120:  # the supervisor restarts it
        time.sleep(0.1)
    served.wait_ready(120)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--faults", type=int, default=0, help="kill -9 a model process this many times")
    ap.add_argument("--timeout", type=float, default=60.0, help="a request slower than this is a hang")
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    add_common_args(ap, "fuzz")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    served = Served(build_repository(args.work), args.work / "fuzz-serve.log")
    try:
        report = run(served, rng, args)
    finally:
        served.stop()
    write_report(args.out, report)
    if report["crashes"] or report["hangs"] or report["server_errors"] or not report["canary_unchanged"]:
        raise SystemExit(1)


def run(served: Served, rng: random.Random, args) -> dict:
    canary, server = canary_tokens(served), served.server_pid()
    rss, outcomes, crashes, hangs, recoveries = RssSampler(served), Counter(), [], 0, []
    fault_at = set(rng.sample(range(args.requests), min(args.faults, args.requests)))
    t0 = time.monotonic()
    for i in range(args.requests):
        if time.monotonic() - t0 > args.max_seconds:
            break
        if i in fault_at:
            recoveries.append(round(inject_fault(served, rng), 2))
            server = served.server_pid()
        name = rng.choice(sorted(CASES))
        start = time.monotonic()
        try:
            result = CASES[name](rng, served, args.timeout)
        except (TimeoutError, socket.timeout):
            result = "hang"
        except urllib.error.URLError as exc:
            result = f"URLError-{type(exc.reason).__name__}"
        except OSError as exc:
            result = type(exc).__name__
        hangs += result == "hang" or time.monotonic() - start > args.timeout
        outcomes[f"{name}:{result}"] += 1
        if served.process.poll() is not None or served.server_pid() != server:
            crashes.append({"request": i, "class": name})
            served.wait_ready(120)
            server = served.server_pid()
    errors = sum(n for key, n in outcomes.items() if key.rpartition(":")[2] in ("500", "502", "504"))
    return {"requests": sum(outcomes.values()), "seed": args.seed, "seconds": round(time.monotonic() - t0, 1),
            "outcomes": dict(sorted(outcomes.items())), "crashes": crashes, "hangs": hangs, "server_errors": errors,
            "faults": len(recoveries), "recovery_s": recoveries, "rss": rss.finish(),
            "canary_unchanged": canary_tokens(served) == canary}


if __name__ == "__main__":
    main()
