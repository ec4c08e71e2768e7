#!/usr/bin/env bash
# Where the GPU time goes: Nsight Systems kernel summary for a 4096-token
# prompt plus 64 decode tokens on the 4B-shaped Qwen3.5 model (skipped
# without nsys).
#   bash 32-profile.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
B="$BUILD/bench/cuda_bench"
f="${QINFER_BENCH_MODELS:-/tmp/qinfer-models}/qwen35-4b-q4_k_m.gguf"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "nsys not found: SKIP"; exit 0; }
[ -f "$f" ] && [ -x "$B" ] || { echo "no model or cuda_bench: SKIP"; exit 0; }
cd /tmp && timeout 150 "$NSYS" profile -o /tmp/qinfer-prof --force-overwrite true --stats=false \
  "$B" --model "$f" --pp 4096 --tg 64 > "$OUT/nsys.log" 2>&1 || { echo "nsys FAILED"; tail -3 "$OUT/nsys.log"; exit 0; }
timeout 120 "$NSYS" stats --report cuda_gpu_kern_sum --format csv /tmp/qinfer-prof.nsys-rep 2>/dev/null > "$OUT/nsys-kern.csv"
echo "== top kernels (time %, total ms, instances, avg us, name)"
python3 - "$OUT/nsys-kern.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
h = next(i for i, r in enumerate(rows) if r and r[0].startswith("Time"))
for r in rows[h + 1:h + 21]:
    print(f"{float(r[0]):5.1f}%  {float(r[1])/1e6:9.2f} ms  {r[2]:>7}  {float(r[3])/1e3:9.1f} us  {r[-1][:90]}")
PY
