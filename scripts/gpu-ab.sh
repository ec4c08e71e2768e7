#!/usr/bin/env bash
# On a GPU machine: decode speed of this tree against an earlier commit, both
# built here and run alternately on one warm GPU, so that the comparison holds
# on whatever card the machine has.
#   git archive --format=tar.gz -o .gpu-data/base-src.tar.gz REV   (before the run)
#   scripts/gpu-ab.sh [BASE_TARBALL]       (default .gpu-data/base-src.tar.gz)
# Builds both `qinfer` binaries (this tree through scripts/gpu-check.sh, with the
# CUDA tests unless QINFER_SKIP_CTEST=1), generates the Qwen3.5-4B and Qwen3-4B
# shaped Q4_K_M models once, then runs `qinfer bench -ngl all -p 0 -n 128 -r 2`
# for ROUNDS (default 2) rounds of base / tree per model and prints a table.
# QINFER_AB_MODELS="qwen35-4b qwen3-4b" picks the presets; QINFER_AB_ARGS
# replaces the bench arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TAR="${1:-.gpu-data/base-src.tar.gz}"
OUT="${OUT:-/tmp/qinfer-gpu-out}"; mkdir -p "$OUT"
[ -f "$TAR" ] || { echo "gpu-ab: no base source $TAR"; exit 1; }
BASE=/tmp/qinfer-ab-base
rm -rf "$BASE" && mkdir -p "$BASE" && tar -xzf "$TAR" -C "$BASE" || { echo "gpu-ab: cannot unpack $TAR"; exit 1; }
[ -d .gpu-deps ] && ln -sfn "$REPO/.gpu-deps" "$BASE/.gpu-deps"
# the base builds beside this tree's build and tests; it starts once gpu-check.sh
# has unpacked the carried Debian packages both use
( sleep 20; cd "$BASE" && OUT="$BASE/out" QINFER_GPU_STEPS=none QINFER_SKIP_CTEST=1 QINFER_BUILD_TARGETS=qinfer \
  QINFER_COMMIT=base bash scripts/gpu-check.sh > "$OUT/ab-base-build.txt" 2>&1 ) &
base_pid=$!
QINFER_GPU_STEPS=05 CTEST_ARGS="${CTEST_ARGS:--R ^cuda_}" bash scripts/gpu-check.sh > "$OUT/ab-check.txt" 2>&1
cat "$OUT/summary.txt"
wait $base_pid
QB="$BASE/build-gpu/qinfer"; Q="$REPO/build-gpu/qinfer"
[ -x "$QB" ] || { echo "gpu-ab: the base did not build (see $OUT/ab-base-build.txt)"; exit 1; }
[ -x "$Q" ] || { echo "gpu-ab: this tree did not build"; exit 1; }
M="${QINFER_BENCH_MODELS:-/tmp/qinfer-models}"; mkdir -p "$M"
ARGS="${QINFER_AB_ARGS:--p 0 -n 128 -r 2}"
R="$OUT/ab.txt"; : > "$R"
for m in ${QINFER_AB_MODELS:-qwen35-4b qwen3-4b}; do
  f="$M/$m-q4_k_m.gguf"
  [ -f "$f" ] || timeout 600 "$Q" convert --random "$m" --outtype q4_k_m "$f" > /dev/null 2>&1 || { echo "gpu-ab: cannot generate $m"; continue; }
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in base tree; do
    bin=$Q; [ $side = base ] && bin=$QB
    for m in ${QINFER_AB_MODELS:-qwen35-4b qwen3-4b}; do
      timeout 300 "$bin" bench -m "$M/$m-q4_k_m.gguf" -ngl all $ARGS -o md 2>&1 | grep -E "^\| .*(tg|pp)[0-9]|rror" \
        | awk -F'|' -v m="$m" -v s="$side" -v r="$round" '{gsub(/ +/, " ", $7); print m, s, "r" r, $7, $8}' | tee -a "$R"
    done
  done
done
echo
echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); base: $TAR; args: $ARGS"
