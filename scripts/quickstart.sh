#!/usr/bin/env bash
# The main job, end to end on a fresh machine: set up, build the shipped tiny pair (torch backend,
# CPU), publish it to a Triton repository, serve it with a real tritonserver, stream one completion
# over gRPC, print text + acceptance + tokens/s, and stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate

dflash-trt build build_configs/tiny-cpu.yaml          # -> out/bundles/tiny-qwen3-dflash, out/triton_repo

read -r HTTP GRPC METRICS < <(python -c "from dflash_trt.triton.server import Ports; p = Ports.pick(); print(p.http, p.grpc, p.metrics)")
mkdir -p out
dflash-trt serve out/triton_repo --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS" \
    --log out/tritonserver.log &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT

for _ in $(seq 1 600); do    # up to 120 s for the server (and the model) to be ready
  if curl -sf "http://127.0.0.1:$HTTP/v2/health/ready" >/dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then echo "tritonserver exited; see out/tritonserver.log" >&2; exit 1; fi
  sleep 0.2
done
curl -sf "http://127.0.0.1:$HTTP/v2/health/ready" >/dev/null || { echo "tritonserver not ready; see out/tritonserver.log" >&2; exit 1; }

echo "--- streaming a completion over gRPC from 127.0.0.1:$GRPC ---"
dflash-trt generate --url "127.0.0.1:$GRPC" --max-new-tokens 160 \
    --prompt $'def read_config(path):\n    """Read a JSON config file and return it as a dict."""\n'
