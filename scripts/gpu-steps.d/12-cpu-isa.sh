#!/usr/bin/env bash
# The host CPU's vector kernels: which ISA level the machine gets, and the int8
# prompt-processing kernels (AVX-512 VNNI where present) against the portable
# and AVX2 ones and the double-precision reference.
#   bash 12-cpu-isa.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
BUILD=$1; OUT=$3
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "flags: $(grep -o -w -E 'avx2|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|amx_tile|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for t in quant_gemm_int8_test quant_matmul_test; do
  bin="$BUILD/tests/$t"
  [ -x "$bin" ] || { echo "$t: not built"; continue; }
  timeout 300 "$bin" > "$OUT/$t.log" 2>&1; rc=$?
  echo "$t: rc=$rc, $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/$t.log" | head -3 | tr '\n' ' ')"
  grep -E "SKIPPED|Skipped|skip" "$OUT/$t.log" | head -3
  grep -B2 -A6 "Failure" "$OUT/$t.log" | head -20
done
