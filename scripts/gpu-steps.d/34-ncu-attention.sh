#!/usr/bin/env bash
# Why decode attention at long contexts runs below the bandwidth: Nsight Compute
# sections (throughput, occupancy, warp stall reasons, memory workload) of the
# split kernel (tensor-core or CUDA-core) and its merge in cuda_decode_test's timing case (16 q / 4 kv
# heads, d 256, f16, capacity 32k; the last lengths timed are 32768 keys).
# Skipped without ncu.
#   bash 34-ncu-attention.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found: SKIP"; exit 0; }
T="$BUILD/tests/cuda_decode_test"
[ -x "$T" ] || { echo "no $T: SKIP"; exit 0; }
# The timing test runs 5, 512, 4096 and 32768 keys, a warm-up and 200 calls
# each: skip the first 3 x 201 split launches and the 32k warm-up, profile two.
timeout 240 "$NCU" --clock-control none --kernel-name regex:attn_split --launch-skip 604 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section LaunchStats "$T" --gtest_filter='CudaDecodeAttentionTiming.*' > "$OUT/ncu-attention.txt" 2>&1 \
  || { echo "ncu FAILED"; tail -5 "$OUT/ncu-attention.txt"; exit 0; }
grep -E "attn_split|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Shared Memory Config|Stall|Warp Cycles Per Issued" \
  "$OUT/ncu-attention.txt" | head -60
