#!/usr/bin/env bash
# aiperf (NVIDIA's benchmark client, unmodified) against `dflash-trt serve --openai-port`: dflash vs
# dflash_ar over OpenAI /v1/completions, streaming, the shipped held-out prompts, a concurrency sweep.
# Prints one table (output tok/s, request latency p50 / p99, TTFT p50, ITL) with DFlash / AR ratios and
# writes out/bench_aiperf/{summary.json,<model>-c<N>/ (aiperf's own artifacts)}.
# aiperf lives in its own virtualenv (AIPERF_VENV, default .venv-aiperf): it pins its own transformers.
# Env: CONCURRENCY="1 4 8" REQUESTS=32 MAX_TOKENS=64 TEMPERATURE=0 CONFIG=build_configs/tiny-cpu.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
CONFIG=${CONFIG:-build_configs/tiny-cpu.yaml}
CONCURRENCY=${CONCURRENCY:-1 4 8}
REQUESTS=${REQUESTS:-32}
MAX_TOKENS=${MAX_TOKENS:-64}
TEMPERATURE=${TEMPERATURE:-0}
AIPERF_VENV=${AIPERF_VENV:-.venv-aiperf}
OUT=out/bench_aiperf
AIPERF_VENV=$AIPERF_VENV ./scripts/setup_aiperf.sh
dflash-trt build "$CONFIG" >/dev/null
read -r HTTP GRPC METRICS OPENAI < <(python -c "from dflash_trt.triton.server import free_port as f; print(f(), f(), f(), f())")
mkdir -p "$OUT"
dflash-trt serve out/triton_repo --http-port "$HTTP" --grpc-port "$GRPC" --metrics-port "$METRICS" \
    --openai-port "$OPENAI" --log out/tritonserver-aiperf.log &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$OPENAI/v1/models" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "dflash-trt serve exited; see out/tritonserver-aiperf.log" >&2; exit 1; }
  sleep 0.2
done
TOKENIZER=$(python -c "from dflash_trt.engine.config import ASSETS; print(ASSETS / 'tiny-qwen3')")
PROMPTS=$(python -c "from dflash_trt.engine.config import ASSETS; print(ASSETS / 'heldout_prompts.jsonl')")
for c in $CONCURRENCY; do
  for model in dflash dflash_ar; do
    echo "aiperf: $model, concurrency $c" >&2
    rm -rf "$OUT/$model-c$c"
    "$AIPERF_VENV/bin/aiperf" profile --model "$model" --url "http://127.0.0.1:$OPENAI" \
        --endpoint-type completions --streaming --tokenizer "$TOKENIZER" \
        --input-file "$PROMPTS" --custom-dataset-type single_turn --random-seed 0 \
        --concurrency "$c" --request-count "$REQUESTS" --warmup-request-count "$c" \
        --extra-inputs "max_tokens:$MAX_TOKENS" --extra-inputs "temperature:$TEMPERATURE" --extra-inputs seed:0 \
        --no-server-metrics --artifact-dir "$OUT/$model-c$c" --ui none >"$OUT/$model-c$c.log" 2>&1 \
      || { echo "aiperf failed; see $OUT/$model-c$c.log" >&2; exit 1; }
  done
done
python scripts/aiperf_table.py "$OUT" $CONCURRENCY
