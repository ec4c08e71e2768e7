#!/usr/bin/env bash
# Where CUDA and CPU part ways: for the reference prompts whose logits disagree,
# dump every named intermediate (QINFER_DUMP) on both backends and print the
# first tensors that differ by more than 1e-3 of their magnitude. Dumping runs
# op by op (no step graphs, no matvec fusion across a dump point), so the
# dumped run's own logits also tell whether graphs or fusion are involved.
#   bash 22-dump-compare.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
BUILD=$1; REF=$2; OUT=$3
Q="$BUILD/qinfer"
for case in "tiny-qwen35.q4_k_m s7" "tiny-qwen35.q4_k_m s64" "tiny-qwen3.q4_k_m s64" "tiny-qwen35.q8_0 s64"; do
  set -- $case; name=$1; seq=$2
  gguf="$REF/$name.gguf"; js="$REF/$name.$seq.json"
  [ -f "$gguf" ] && [ -f "$js" ] || continue
  ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$js")
  d="$OUT/dump/$name.$seq"; rm -rf "$d"; mkdir -p "$d"
  QINFER_DUMP="$d/cpu" "$Q" logits -m "$gguf" --ids "$ids" -o "$d/cpu.bin" -ngl 0 > "$d/cpu.log" 2>&1
  QINFER_DUMP="$d/gpu" "$Q" logits -m "$gguf" --ids "$ids" -o "$d/gpu.bin" -ngl 99 > "$d/gpu.log" 2>&1
  QINFER_CUDA_FUSE=0 "$Q" logits -m "$gguf" --ids "$ids" -o "$d/gpu-nofuse.bin" -ngl 99 > "$d/gpu-nofuse.log" 2>&1
  QINFER_CUDA_GRAPHS=0 "$Q" logits -m "$gguf" --ids "$ids" -o "$d/gpu-nographs.bin" -ngl 99 > "$d/gpu-nographs.log" 2>&1
  QINFER_CUDA_MMA=0 "$Q" logits -m "$gguf" --ids "$ids" -o "$d/gpu-nomma.bin" -ngl 99 > "$d/gpu-nomma.log" 2>&1
  QINFER_CUDA_MMA=int8 "$Q" logits -m "$gguf" --ids "$ids" -o "$d/gpu-int8.bin" -ngl 99 > "$d/gpu-int8.log" 2>&1
  echo "== $name $seq"
  python3 - "$d" <<'PY'
import sys, os, numpy as np
d = sys.argv[1]
def load(p):
    return np.fromfile(p, dtype=np.float32) if os.path.exists(p) else None
C = load(f"{d}/cpu.bin")
for v in ["gpu", "gpu-nofuse", "gpu-nographs", "gpu-nomma", "gpu-int8"]:
    G = load(f"{d}/{v}.bin")
    if C is None or G is None or C.shape != G.shape:
        print(f"  logits {v}: missing"); continue
    print(f"  logits {v}: max|cpu-gpu| {np.max(np.abs(C - G)):.3g} (max|cpu| {np.max(np.abs(C)):.3g})")
idx = f"{d}/cpu/index.txt"
if not os.path.exists(idx):
    print("  no CPU dump"); sys.exit()
shown = 0
worst = {}
for line in open(idx):
    base = line.split()[0]
    a, b = load(f"{d}/cpu/{base}.f32"), load(f"{d}/gpu/{base}.f32")
    if a is None or b is None or a.shape != b.shape:
        continue
    m = float(np.max(np.abs(a))) or 1.0
    rel = float(np.max(np.abs(a - b))) / m
    name = base.split(".", 2)[2]
    worst[name] = max(worst.get(name, 0.0), rel)
    if rel > 1e-3 and shown < 6:
        i = int(np.argmax(np.abs(a - b)))
        print(f"  first diverging: {base} rel {rel:.3g} (at {i}: cpu {a[i]:.5g} gpu {b[i]:.5g})")
        shown += 1
print("  worst relative difference per tensor name: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1])[:10]))
PY
done
