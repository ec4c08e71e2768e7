#!/usr/bin/env bash
# Per-kernel GPU time of one decode token (Nsight Compute, clocks left alone):
# which kernels a Qwen3.5-4B Q4_K_M token spends its time in, how many bytes
# each reads from DRAM, and how much of the token's wall time is kernel time
# at all (the rest is launch gaps). Skipped without ncu.
#   bash 33-ncu-decode.sh BUILD_DIR REF_DIR OUT_DIR
set -uo pipefail
. "$(dirname "$0")/lib/common.sh" "$@"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found: SKIP"; exit 0; }
need_bench_model
# Decode tokens are separated by the argmax kernel that ends each step.
timeout 240 "$NCU" --clock-control none --graph-profiling node --csv --print-units base \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  "$Q" bench -m "$f" -ngl all -p 0 -n 4 -r 1 > "$OUT/ncu-decode.csv" 2> "$OUT/ncu-decode.err" \
  || { echo "ncu FAILED"; tail -5 "$OUT/ncu-decode.err"; tail -5 "$OUT/ncu-decode.csv"; exit 0; }
python3 - "$OUT/ncu-decode.csv" <<'PY'
import csv, sys, collections, re
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
h = rows[0]; ix = {k: i for i, k in enumerate(h)}
kern = collections.OrderedDict()
for r in rows[1:]:
    k = kern.setdefault(r[ix["ID"]], {"name": r[ix["Kernel Name"]], "grid": r[ix["Grid Size"]], "block": r[ix["Block Size"]]})
    v = r[ix["Metric Value"]].replace(",", "")
    k[r[ix["Metric Name"]]] = float(v) if v else 0.0
seq = list(kern.values())
ends = [i for i, k in enumerate(seq) if "argmax" in k["name"]]
if len(ends) < 2:
    print("fewer than two argmax kernels seen: cannot split tokens"); sys.exit(0)
tok = seq[ends[-2] + 1:ends[-1] + 1]           # the last complete decode token
t = sum(k["gpu__time_duration.sum"] for k in tok) / 1e3
b = sum(k["dram__bytes_read.sum"] for k in tok) / 1e6
print(f"one decode token: {len(tok)} kernels, {t:.1f} us of kernel time, {b:.1f} MB read from DRAM "
      f"({b / t:.2f} TB/s while kernels run)")
agg = collections.OrderedDict()
for k in tok:
    name = re.sub(r"\(.*", "", k["name"]).replace("void ", "").replace("unnamed>::", "")[:60]
    a = agg.setdefault(name, [0, 0.0, 0.0])
    a[0] += 1; a[1] += k["gpu__time_duration.sum"] / 1e3; a[2] += k["dram__bytes_read.sum"] / 1e6
print(f"{'kernel':60} {'calls':>5} {'us':>8} {'us/call':>8} {'MB':>8} {'TB/s':>6}")
for name, (n, us, mb) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:60} {n:5d} {us:8.1f} {us / n:8.2f} {mb:8.1f} {mb / us if us else 0:6.2f}")
PY
