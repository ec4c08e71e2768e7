#!/usr/bin/env bash
# compute-sanitizer memcheck on short runs: a few kernel tests and qinfer logits
# on two tiny reference models (prefill + the graph-replayed decode path).
#   bash 25-cuda-sanitizer.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$CS" ] || { echo "compute-sanitizer not found: SKIP"; exit 0; }
export QINFER_REFERENCE_DIR="$REF"
res=()
chk() {  # name cmd...
  local name=$1; shift
  timeout 300 "$CS" --tool memcheck --leak-check no --error-exitcode 99 "$@" > "$OUT/memcheck-$name.log" 2>&1
  local rc=$?
  local errs; errs=$(grep -E "ERROR SUMMARY" "$OUT/memcheck-$name.log" | tail -1)
  if [ $rc -eq 0 ]; then res+=("$name PASS $errs"); else res+=("$name FAIL rc=$rc $errs"); grep -E "Invalid|Error|at 0x|by thread" "$OUT/memcheck-$name.log" | head -12; fi
}
chk ops "$BUILD/tests/cuda_ops_test" --gtest_filter='CudaOps.*:*CudaAttention.*d64*:*CudaDeltaNet.*/0:CudaGraphs.*:CudaFusion.QuantizeInsideAttentionMergeEqualsSeparate:CudaFusion.KvStoreInsideNormRopeEqualsKvStore'
chk kernels "$BUILD/tests/cuda_kernels_test" --gtest_filter='*Q4_K*:*Q6_K*:*Q5_0*:CudaArgmax.*:CudaQuantize.*'
# decode (tensor-core split kernels, f16 and q8_0 caches, its merge) and prompt attention: cp.async
# tiles, zero-filled tails, poisoned caches
chk attention "$BUILD/tests/cuda_decode_test" \
  --gtest_filter='*CudaDecodeAttention.*d256_g4_F16:*CudaDecodeAttention.*d256_g4_Q8_0:*CudaDecodeAttention.*d128_g8_Q8_0:*CudaDecodeAttention.*d64_g8_F16:*CudaDecodeAttention.*d128_g2_F32:CudaDecodeAttentionGraph.*'
chk attention-prefill "$BUILD/tests/cuda_prefill_attention_test" --gtest_filter='*CudaPrefillAttention.*d256_g4:CudaPrefillAttentionDeclines.*'
chk model "$BUILD/tests/cuda_model_test" --gtest_filter='*tiny_qwen35_q4_k_m*'
for m in tiny-qwen35.q4_k_m tiny-qwen3.q4_k_m; do
  [ -f "$REF/$m.gguf" ] || continue
  chk "logits-$m" "$BUILD/qinfer" logits -m "$REF/$m.gguf" --ids 8193,872,198,39,4791,1879,8194 -o "$OUT/memcheck-$m.bin" -ngl 99
done
echo
echo "compute-sanitizer memcheck"
for r in "${res[@]}"; do echo "  $r"; done
