# The H200 audit at depth 512, three routes back to back on one machine, after `source bench/h200/setup.sh`
# (which builds llama.cpp in the background): bench/h200/audit512.sh [TOKENS]
# tinygrad's default, tinygrad BEAM=2 (its search cached by an earlier call) and llama.cpp, each profiled
# kernel by kernel through CUPTI in its own graph replay; everything lands in $OUT.
set -euo pipefail
tokens=${1:-16}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
while [ ! -e /tmp/llama-build.done ]; do
  if ! pgrep -f "cmake --build /tmp/lb" > /dev/null; then tail -20 /tmp/llama-build.log; exit 1; fi
  sleep 5
done
for route in default beam2 llama; do
  case $route in
    default) flags=() ;;
    beam2) flags=(--beam 2) ;;
    llama) flags=(--engine llama.cpp) ;;
  esac
  /usr/bin/time -f "$route: %e s wall" python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 \
    --tokens "$tokens" --no-hash --out "$OUT/$route.json" --json "${flags[@]}" > "$OUT/$route.summary.json"
done
