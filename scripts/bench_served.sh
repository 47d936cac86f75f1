#!/usr/bin/env bash
# Served benchmark in one run: build the tiny CPU preset, serve it (dflash + dflash_ar), sweep
# concurrency over gRPC streaming, print the tables (DFlash vs AR, scaling vs concurrency 1) and
# write out/bench_served/{results.json,pareto.png,acceptance_histogram.png}. Extra args go to bench.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
CONFIG=${CONFIG:-build_configs/tiny-cpu.yaml}
dflash-trt build "$CONFIG" >/dev/null
read -r HTTP GRPC METRICS < <(python -c "from dflash_trt.triton.server import Ports; p = Ports.pick(); print(p.http, p.grpc, p.metrics)")
mkdir -p out
dflash-trt serve out/triton_repo --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS" \
    --log out/tritonserver-bench.log &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$HTTP/v2/health/ready" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "tritonserver exited; see out/tritonserver-bench.log" >&2; exit 1; }
  sleep 0.2
done
dflash-trt bench --url "127.0.0.1:$GRPC" --out out/bench_served "$@"
