#!/usr/bin/env bash
# qinfer serve on the 4B-shaped Q4_K_M model: aggregate generated tokens/s and
# TTFT p50/p99 at 1, 8, 32 and 64 concurrent streaming clients (512-token
# prompts, 128 generated tokens each), then turn-2 TTFT of a conversation with
# a ~16k-token history (prompt cache with DeltaNet checkpoints).
#   bash 50-server.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
need_bench_model
"$Q" serve --help >/dev/null 2>&1 || { echo "this build has no server: SKIP"; exit 0; }
health() {  # port
  for _ in $(seq 1 240); do
    python3 - "$1" <<'PY' 2>/dev/null && return 0
import sys, urllib.request, json
r = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
sys.exit(0 if json.load(r).get("status") == "ok" else 1)
PY
    sleep 0.5
  done
  return 1
}
# ~512-token prompts (distinct per line so the prompt cache cannot serve them;
# the 4B preset's tokenizer made ~2,000 tokens of 500 words, so 125 words; measured below).
python3 - > "$OUT/p512.txt" <<'PY'
import random
words = "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their has would when".split()
for i in range(64):
    r = random.Random(i)
    print(f"Request {i}: " + " ".join(r.choice(words) for _ in range(125)))
PY
# The random-weight model's tokenizer splits these words finer than a trained
# one would: report what a prompt really is.
echo "prompt tokens (first line): $(head -1 "$OUT/p512.txt" | "$Q" tokenize -m "$f" --file - --ids-only --raw-lines 2>/dev/null | tr ',' ' ' | wc -w)"
port=18080
"$Q" serve -m "$f" -ngl all -np 64 -c 4096 --port $port > "$OUT/serve.log" 2>&1 &
pid=$!
if health $port; then
  echo "== load (~512-token prompts, 128 tokens each, at least 8 s per point)"
  timeout 300 "$Q" serve loadgen --port $port --clients 1,8,32,64 --duration 8 --max-tokens 128 --prompt-file "$OUT/p512.txt" 2>&1 | tee "$OUT/serve-load.txt"
  server_metrics $port "^qinfer_(requests_total|forward|batch|sample|snapshot|prompt_tokens|generated|state_bytes)"
else
  echo "server did not become healthy"; tail -5 "$OUT/serve.log"
fi
kill -INT $pid; wait $pid; echo "serve exit: $?"
echo "== single-client decode vs qinfer bench"
timeout 120 "$Q" bench -m "$f" -ngl all -p 512 -n 128 -r 2 2>&1 | grep -E "pp512|tg128"
echo "== multi-turn, ~16k-token history"
port=18081
"$Q" serve -m "$f" -ngl all -np 1 -c 20480 --port $port > "$OUT/serve-mt.log" 2>&1 &
pid=$!
if health $port; then
  timeout 300 "$Q" serve loadgen --port $port --multiturn 16000 --turns 3 2>&1 | tee "$OUT/serve-multiturn.txt"
  server_metrics $port "^qinfer_(prompt_cache|snapshot|forward_seconds|prompt_tokens)"
else
  echo "server did not become healthy"; tail -5 "$OUT/serve-mt.log"
fi
kill -INT $pid; wait $pid; echo "serve exit: $?"
