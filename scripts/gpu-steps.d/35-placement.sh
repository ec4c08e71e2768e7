#!/usr/bin/env bash
# Split CPU/GPU execution on the 4B-shaped Q4_K_M model: throughput for
# -ngl 0/8/16/24/all with and without prompt offload, --gpu-layers auto under 8/12/24 GiB limits and the whole
# device, and the out-of-memory path (a clear error and exit 1, no crash).
#   bash 35-placement.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
need_bench_model
T=$(( $(nproc) ))
echo "== -ngl sweep ($T threads): pp512 / tg64 (prompt offload from 32 tokens, the default)"
for ngl in 0 8 16 24 all; do
  timeout 240 "$Q" bench -m "$f" -p 512 -n 64 -r 2 -t "$T" -ngl "$ngl" -o md 2>"$OUT/ngl-$ngl.err" | grep -E "pp512|tg64" | sed "s/^/ngl $ngl /" \
    || { echo "ngl $ngl FAILED"; tail -3 "$OUT/ngl-$ngl.err"; }
done
echo "== where a split decode step spends its time (QINFER_STEP_TIMES, tg64)"
for ngl in 0 24; do
  QINFER_STEP_TIMES=1 timeout 240 "$Q" bench -m "$f" -p 0 -n 64 -r 2 -t "$T" -ngl "$ngl" -o md 2>&1 | grep -E "^  decode|tg64" | sed "s/^/ngl $ngl /"
done
QB="$BUILD/bench/quant_bench"
[ -x "$QB" ] && timeout 60 "$QB" --benchmark_filter="BM_MemRead/threads:$T/" --benchmark_min_time=0.2 2>&1 | grep -E "^BM_" \
  | sed -E 's/ +[0-9]+ ns +[0-9]+ ns +[0-9]+//; s/^/host read bandwidth: /'
# QINFER_PLACEMENT_QUICK=1: the sweep and the split above only.
[ -n "${QINFER_PLACEMENT_QUICK:-}" ] && exit 0
echo "== the same prompts without prompt offload (--no-op-offload): pp512"
for ngl in 0 16 24; do
  timeout 240 "$Q" bench -m "$f" -p 512 -n 0 -r 2 -t "$T" -ngl "$ngl" --no-op-offload -o md 2>"$OUT/ngl-$ngl-nooff.err" | grep -E "pp512" | sed "s/^/ngl $ngl no-offload /" \
    || { echo "ngl $ngl no-offload FAILED"; tail -3 "$OUT/ngl-$ngl-nooff.err"; }
done
echo "== where prompt offload starts to pay (-ngl 0 and 16): pp32..256, offload from 1 token vs never"
for ngl in 0 16; do
  for mb in 1 0; do
    timeout 240 "$Q" bench -m "$f" -p 32,64,128,256 -n 0 -r 2 -t "$T" -ngl "$ngl" --op-offload-min-batch "$mb" -o md 2>>"$OUT/offload-threshold.err" \
      | grep -E "pp[0-9]" | sed "s/^/ngl $ngl min-batch $mb /" || echo "ngl $ngl min-batch $mb FAILED"
  done
done
echo "== time to first token, 4096-token prompt, -ngl 16 with and without prompt offload"
for extra in "" "--no-op-offload"; do
  timeout 240 "$Q" bench -m "$f" -p 4096 -n 0 -r 1 -t "$T" -ngl 16 $extra -o md 2>/dev/null | grep -E "pp4096|TTFT" | sed "s/^/ngl 16 ${extra:-offload} /"
done
echo "== --gpu-layers auto"
for lim in 8GiB 12GiB 24GiB none; do
  extra=""; [ "$lim" = none ] || extra="--vram-limit $lim"
  out=$(timeout 120 "$Q" run -m "$f" -p "Hello" -n 16 --temp 0 -c 4096 -ngl auto $extra 2>&1)
  rc=$?
  echo "auto $lim: rc=$rc $(echo "$out" | grep -E "gpu layers|error" | head -2 | tr '\n' ' ') $(echo "$out" | grep -oE "[0-9.]+ tok/s" | tail -1)"
done
echo "== out of memory"
out=$(timeout 120 "$Q" run -m "$f" -p "Hello" -n 4 -ngl all --vram-limit 1GiB 2>&1); rc=$?
echo "ngl all, limit 1GiB: rc=$rc: $(echo "$out" | grep -E "error" | head -1)"
out=$(timeout 120 "$Q" run -m "$f" -p "Hello" -n 4 -ngl all -c 131072 --vram-limit 3GiB 2>&1); rc=$?
echo "ngl all, -c 131072, limit 3GiB: rc=$rc: $(echo "$out" | grep -E "error" | head -1)"
