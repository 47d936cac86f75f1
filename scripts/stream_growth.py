#!/usr/bin/env python3
"""How much of tritonserver's heap each request leaves behind, by transport and by how a stream ends.

    python scripts/stream_growth.py --transport http-stream --end close --requests 600
    python scripts/stream_growth.py --transport http-stream --end cancel --requests 600   # the old front

tritonserver on the shipped pair's repository (preset tiny-cpu, built under --work like the soak's), the
HTTP front in this process, `--clients` threads sending the soak's requests; after `--warmup` requests the
server's RssAnon (/proc/PID/status) is read, then again after `--requests` more: KB per request and bytes per
streamed response. `--end cancel` makes the front cancel every complete answer's gRPC stream (what it did
before session 12) instead of closing its side. One variable at a time; loopback only.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

from serve_harness import ROOT, _rss, build_repository
from soak_serve import requests_to_check

from dflash_trt.triton import front
from dflash_trt.triton.client import grpc_generate, http_generate
from dflash_trt.triton.front_app import Front, make_app
from dflash_trt.triton.server import TritonServer, free_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=["grpc", "http", "http-stream"], default="http-stream")
    ap.add_argument("--end", choices=["close", "cancel"], default="close")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "reliability")
    args = ap.parse_args()

    if args.end == "cancel":  # the front before session 12: a complete answer's stream cancelled, not closed
        def cancelling(self, iterator, close, cancel):
            self.iterator, self.close, self.cancel = iterator, cancel, cancel
        front.Answer.__init__ = cancelling
    repository = build_repository(args.work)
    server = TritonServer(repository, log_path=args.work / "stream-growth-server.log", http_host="127.0.0.1")
    server.start(timeout=180)
    port = free_port()
    running = Front(make_app(server.url, server.grpc_url, frozenset({"dflash", "dflash_ar"})), "127.0.0.1", port).start()
    checks = requests_to_check(12, random.Random(args.seed))

    def load(count: int) -> int:
        left, responses, lock = [count], [0], threading.Lock()

        def client(k: int) -> None:
            rng = random.Random(args.seed * 1000 + k)
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                inputs = checks[rng.randrange(len(checks))]
                if args.transport == "grpc":
                    out = grpc_generate(server.grpc_url, inputs | {"stream": True})
                else:
                    out = http_generate(f"127.0.0.1:{port}", inputs | {"stream": args.transport == "http-stream"})
                with lock:
                    responses[0] += out.responses

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return responses[0]

    try:
        load(args.warmup)
        before, t0 = _rss(server.process.pid, "RssAnon") // 1024, time.monotonic()
        responses = load(args.requests)
        time.sleep(2)
        after = _rss(server.process.pid, "RssAnon") // 1024
    finally:
        running.stop()
        server.stop()
    grown = after - before
    print(f"{args.transport}, end {args.end}: {args.requests} requests ({responses} responses) in "
          f"{time.monotonic() - t0:.0f} s; tritonserver RssAnon {before / 1024:.1f} -> {after / 1024:.1f} MB: "
          f"{grown / args.requests:.2f} KB per request, {grown * 1024 / max(responses, 1):.0f} B per response")


if __name__ == "__main__":
    main()
