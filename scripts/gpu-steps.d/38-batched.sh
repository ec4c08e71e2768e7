#!/usr/bin/env bash
# Batched decode (what a server under load runs): aggregate tokens/s for 1-64
# sequences decoding together, then GPU time per op (QINFER_CUDA_PROFILE) for
# decode at batch 1 and 64 and for a 512-token prompt.
#   bash 38-batched.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
need_bench_model
echo "== Q4_K decode matvec: pipelined (default) vs plain unit loop (QINFER_CUDA_MATVEC=v1)"
for v in default v1; do
  if [ $v = v1 ]; then export QINFER_CUDA_MATVEC=v1; else unset QINFER_CUDA_MATVEC; fi
  timeout 120 "$Q" bench -m "$f" -ngl all -p 0 -n 128 -r 3 2>&1 | grep -E "tg128" | sed "s/^/$v /"
  js="$REF/tiny-qwen35.q4_k_m.s7.json"
  if [ -f "$js" ]; then
    ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$js")
    "$Q" logits -m "$REF/tiny-qwen35.q4_k_m.gguf" --ids "$ids" -o "$OUT/mv-$v.bin" -ngl 99 > /dev/null 2>&1
  fi
done
unset QINFER_CUDA_MATVEC
cmp -s "$OUT/mv-default.bin" "$OUT/mv-v1.bin" && echo "tiny-qwen35.q4_k_m logits: pipelined == plain, bit for bit" \
  || echo "tiny-qwen35.q4_k_m logits: pipelined and plain DIFFER"
echo "== batched decode: tg32 x B"
timeout 300 "$Q" bench -m "$f" -ngl all -p 0 -n 32 -np 1,8,32,64 -r 2 2>&1 | grep -E "tg32"
profile() {  # label bench-args...
  local label=$1; shift
  local t0=$(date +%s)
  QINFER_CUDA_PROFILE=1 timeout 60 "$Q" bench -m "$f" -ngl all -r 1 "$@" > "$OUT/profile-$label.txt" 2>&1
  echo "== profile $label ($*): rc=$? in $(( $(date +%s) - t0 )) s; top ops"
  grep -q "profile (GPU time per op" "$OUT/profile-$label.txt" || { tail -5 "$OUT/profile-$label.txt"; return; }
  sed -n '/profile (GPU time per op/,$p' "$OUT/profile-$label.txt" | head -22
}
profile tg1 -p 0 -n 16
profile tg64 -p 0 -n 8 -np 64
profile pp512 -p 512 -n 0
