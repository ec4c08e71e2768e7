#!/usr/bin/env bash
# CPU engine speed on the GPU host's CPU (no GPU involved: -ngl 0): a random
# Qwen3.5-0.8B-shaped Q4_K_M model and the tiny reference models, with the
# machine's read bandwidth measured in the same run and decode's fraction of it.
#   bash 15-cpu-bench.sh BUILD_DIR REF_DIR OUT_DIR
# Models are generated once per machine into $QINFER_BENCH_MODELS (default /tmp/qinfer-models).
# About 1-2 minutes on a 16-core machine.
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
Q="$BUILD/qinfer"
M="${QINFER_BENCH_MODELS:-/tmp/qinfer-models}"; mkdir -p "$M"
[ -x "$Q" ] || { echo "qinfer missing"; exit 0; }
PHYS=$(lscpu -p=core,socket 2>/dev/null | grep -v '^#' | sort -u | wc -l)
[ "$PHYS" -ge 1 ] 2>/dev/null || PHYS=$(nproc)
LOG="$OUT/cpu-bench.txt"; : > "$LOG"
{
  echo "== machine"
  lscpu 2>/dev/null | grep -E '^(Model name|Socket|Core|Thread|CPU\(s\)|L3|NUMA node\(s\))' || true
  echo "physical cores: $PHYS"
  grep -E '^MemTotal' /proc/meminfo || true
} | tee -a "$LOG"

f="$M/qwen35-0.8b-q4_k_m.gguf"
if [ ! -f "$f" ]; then
  t0=$(date +%s)
  timeout 300 "$Q" convert --random qwen35-0.8b --outtype q4_k_m "$f" > "$OUT/gen-qwen35-0.8b.log" 2>&1 \
    || { echo "generating qwen35-0.8b FAILED"; tail -3 "$OUT/gen-qwen35-0.8b.log"; rm -f "$f"; }
  [ -f "$f" ] && echo "generated $f in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
fi

bench() {  # model args...
  local m=$1; shift
  [ -f "$m" ] || { echo "missing $m" | tee -a "$LOG"; return; }
  echo "== $(basename "$m") $*" | tee -a "$LOG"
  timeout 240 "$Q" bench -m "$m" -ngl 0 "$@" 2>&1 | tee -a "$LOG"
  echo "$(basename "$m") $*: rc=${PIPESTATUS[0]}" >> "$OUT/cpu-bench-rc.txt"
}
: > "$OUT/cpu-bench-rc.txt"
T_LIST="$PHYS"; [ "$PHYS" -gt 8 ] && T_LIST="$PHYS,8"
bench "$f" -p 512 -n 128 -r 3 -t "$T_LIST"
bench "$f" -p 64 -n 32 -r 2 -t 1
for m in tiny-qwen35.q4_k_m tiny-qwen3.q4_k_m tiny-qwen2.q8_0; do
  bench "$REF/$m.gguf" -p 512 -n 128 -r 3 -t "$PHYS"
done

echo
echo "CPU speed (target: qwen35-0.8b tg128 decode >= 60% of the measured read bandwidth with all cores)"
grep -E "^== [^m]|^\| .* (pp|tg)[0-9]+ |memory read bandwidth|weights/token" "$LOG"
