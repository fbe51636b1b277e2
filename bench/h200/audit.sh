# One route of the H200 audit, after `source bench/h200/setup.sh`: bench/h200/audit.sh ROUTE [profile flags]
# ROUTE names the output; everything lands in $OUT. Kernels are timed in the graph replay (CUPTI).
set -euo pipefail
route=$1; shift
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 --tokens 16 --out "$OUT/tinygrad_$route.json" --json "$@"
