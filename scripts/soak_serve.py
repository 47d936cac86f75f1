#!/usr/bin/env python3
"""Soak a real `dflash-trt serve` on loopback: many clients for a while, tokens checked, memory watched.

    python scripts/soak_serve.py --clients 16 --seconds 600 --out out/reliability/soak.json

1. expected tokens: each of a fixed set of requests (held-out prompts, greedy and seeded sampling),
   decoded once alone;
2. neighbour latency: a small request's median latency alone, then beside a hostile neighbour that
   keeps sending what once stalled or crashed the server (the longest stop-word lists it accepts,
   megabyte prompts, deep JSON), side by side in one run;
3. the soak: `--clients` threads for `--seconds`, each sending those requests over gRPC streams and the
   HTTP front (generate, generate_stream); every answer must carry exactly the expected tokens;
4. the report: requests, errors, mismatches, latency p50 / p99, RSS of the server and its model
   processes at the start / end / max of the measured window (after `--warmup-seconds` of the same
   load), its samples every 5 s, and the growth in percent.
Seeded, bounded in time, loopback only.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.request

from serve_harness import (
    ROOT,
    RssSampler,
    Served,
    add_common_args,
    build_repository,
    grpc_generate,
    http_generate,
    request_inputs,
    write_report,
)

SMALL = request_inputs("x = 1\n", max_tokens=8, stream=False)


def requests_to_check(count: int, rng: random.Random) -> list[dict]:
    prompts = [json.loads(line)["token_ids"] for line in (ROOT / "dflash_trt" / "assets" / "heldout_prompts.jsonl")
               .read_text().splitlines()[:count]]
    out = []
    for i, prompt in enumerate(prompts):
        sampled = dict(temperature=0.8, top_k=40, seed=rng.randrange(2**32)) if i % 2 else {}
        out.append(request_inputs(input_ids=prompt[:64], max_tokens=rng.choice([16, 48, 96]), **sampled))
    return out


def send(served, inputs: dict, transport: str):
    if transport == "grpc":
        return grpc_generate(served.grpc, inputs | {"stream": True}, timeout=120)
    return http_generate(served.http, inputs | {"stream": transport == "http-stream"}, timeout=120)


def hostile(rng: random.Random) -> dict:
    """What once stalled neighbours: the longest stop-word lists the server accepts (64 x 512 bytes, each
    token once rescanned them all), prompts far past the byte bound (once tokenized whole: 1 MB over gRPC,
    7 MB through the front), and deep JSON (once a crash)."""
    kind = rng.choice(["stop_words", "megabyte_prompt", "deep_json"])
    if kind == "stop_words":
        words = tuple("".join(rng.choice("qzj") for _ in range(512)) for _ in range(64))
        return request_inputs("def main():\n", max_tokens=8, stop_words=words, ignore_eos=True)  # a small one's size
    if kind == "megabyte_prompt":
        return request_inputs("x" * rng.choice([1 << 20, 7 << 20]), max_tokens=4)
    return {"deep": True}


def send_hostile(served, rng: random.Random) -> None:
    inputs = hostile(rng)
    if inputs.get("deep"):
        raw = b'{"text_input": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        request = urllib.request.Request(f"http://{served.http}/v2/models/dflash/generate", data=raw)
        try:
            urllib.request.urlopen(request, timeout=60).read()
        except urllib.error.HTTPError:
            pass
        return
    send(served, inputs, rng.choice(["grpc", "http"]) if len(inputs.get("text_input", "")) < 2 << 20 else "http")


def latency(served: Served, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        grpc_generate(served.grpc, SMALL, timeout=60)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _Endpoints:
    def __init__(self, http: str, grpc: str):
        self.http, self.grpc = http, grpc


def _neighbour(http: str, grpc: str, seed: int, stop) -> None:
    """The hostile neighbour, in a process of its own (a thread would take the measuring client's GIL)."""
    served, rng = _Endpoints(http, grpc), random.Random(seed)
    while not stop.is_set():
        try:
            send_hostile(served, rng)
        except Exception:  # noqa: BLE001 - refusals are expected; the point is what they cost the others
            pass


def neighbour_ratio(served: Served, seed: int, n: int = 20) -> dict:
    import multiprocessing

    alone = latency(served, n)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    neighbour = context.Process(target=_neighbour, args=(served.http, served.grpc, seed, stop), daemon=True)
    neighbour.start()
    time.sleep(3.0)  # it is sending by now
    beside = latency(served, n)
    stop.set()
    neighbour.join(timeout=120)
    return {"alone_ms": round(alone * 1000, 1), "beside_hostile_ms": round(beside * 1000, 1),
            "ratio": round(beside / alone, 2)}


def soak(served: Served, checks: list[dict], expected: list[list[int]], clients: int, seconds: float, seed: int):
    stats = {"requests": 0, "errors": [], "mismatches": 0}
    latencies: list[float] = []
    lock, deadline = threading.Lock(), time.monotonic() + seconds

    def client(k: int):
        rng = random.Random(seed * 1000 + k)
        while time.monotonic() < deadline:
            i = rng.randrange(len(checks))
            t0 = time.perf_counter()
            try:
                result = send(served, checks[i], rng.choice(["grpc", "http", "http-stream"]))
                ok, error = result.token_ids == expected[i], None
            except Exception as exc:  # noqa: BLE001 - counted, reported
                ok, error = False, repr(exc)[:200]
            with lock:
                stats["requests"] += 1
                latencies.append(time.perf_counter() - t0)
                if error:
                    stats["errors"].append(error)
                elif not ok:
                    stats["mismatches"] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    stats["p50_s"] = round(latencies[len(latencies) // 2], 3) if latencies else None
    stats["p99_s"] = round(latencies[int(len(latencies) * 0.99)], 3) if latencies else None
    stats["errors"] = {"count": len(stats["errors"]), "first": stats["errors"][:5]}
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--warmup-seconds", type=float, default=60.0,
                    help="the same load before the measured window (RSS is measured from its end)")
    ap.add_argument("--requests-to-check", type=int, default=12)
    add_common_args(ap, "soak")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    served = Served(build_repository(args.work), args.work / "soak-serve.log")
    try:
        checks = requests_to_check(args.requests_to_check, rng)
        expected = [send(served, c, "grpc").token_ids for c in checks]
        neighbour = neighbour_ratio(served, args.seed)
        if args.warmup_seconds:  # the same load first: allocator and caches reach their working size
            soak(served, checks, expected, args.clients, args.warmup_seconds, args.seed + 1)
        rss = RssSampler(served, every_s=5.0)
        result = soak(served, checks, expected, args.clients, args.seconds, args.seed)
        memory = rss.finish()
    finally:
        served.stop()
    memory["growth_pct"] = round(100 * (memory["end_mb"] - memory["start_mb"]) / memory["start_mb"], 2)
    report = {"clients": args.clients, "seconds": args.seconds, "seed": args.seed, **result, "rss": memory,
              "neighbour_latency": neighbour}
    write_report(args.out, report)
    if result["errors"]["count"] or result["mismatches"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
