#!/usr/bin/env bash
# Bounded libFuzzer run over the GGUF reader (fuzz/gguf_fuzz.cpp), seeded with
# small synthetic files and miniatures of the reference models. Skips (exit 0)
# with a message when clang or libFuzzer is not available.
#   FUZZ_SECONDS   run time (default 60)
#   FUZZ_BUILD_DIR build directory (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${FUZZ_SECONDS:-60}"
BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
REF_DIR="${QINFER_REFERENCE_DIR:-../shared/reference}"

if ! command -v clang >/dev/null 2>&1 || ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: skipped: clang/clang++ not found (install clang to fuzz the GGUF reader)"
  exit 0
fi
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
  echo "fuzz: skipped: clang cannot link libFuzzer (-fsanitize=fuzzer); install libclang-rt-dev"
  exit 0
fi

CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQINFER_FUZZ=ON \
  -DQINFER_TESTS=OFF -DQINFER_BENCH=OFF -DQINFER_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target gguf_fuzz gguf_seeds >/dev/null

SEEDS="$BUILD_DIR/fuzz-seeds"
CORPUS="$BUILD_DIR/fuzz-corpus"   # grows across runs
mkdir -p "$SEEDS" "$CORPUS"
models=()
for f in "$REF_DIR"/*.gguf; do [ -f "$f" ] && models+=("$f"); done
"$BUILD_DIR/fuzz/gguf_seeds" "$SEEDS" "${models[@]}"

echo "fuzz: gguf_fuzz for ${SECS}s ($(ls "$SEEDS" | wc -l) seeds, $(ls "$CORPUS" | wc -l) corpus files)"
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" "$BUILD_DIR/fuzz/gguf_fuzz" "$CORPUS" "$SEEDS" \
  -max_total_time="$SECS" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -dict=fuzz/gguf.dict -artifact_prefix="$BUILD_DIR/fuzz-crash-" -print_final_stats=1 2>"$BUILD_DIR/fuzz.log" || {
  echo "fuzz: FAILED; crash input saved as $BUILD_DIR/fuzz-crash-*; log tail:"
  tail -40 "$BUILD_DIR/fuzz.log"
  exit 1
}
grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$BUILD_DIR/fuzz.log" | sed 's/^/fuzz: /'
echo "fuzz: ok"
