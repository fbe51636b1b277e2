# The search fanned out through Dask on one host's GPUs, after `source bench/h200/setup.sh`: the same
# search (the 8B-shaped model at KV depth 512, tinygrad's opts family, BUDGET settings a kernel) with
# --workers 1, then --workers 2, each on a fresh ledger, with tinygrad's compile cache off (CACHELEVEL=0)
# and the CUDA driver's cache of PTX compiled to machine code off (CUDA_CACHE_DISABLE=1: tinygrad hands
# the driver PTX), so neither reuses the other's work. Everything lands in $OUT.
#   BUDGET=16 bash bench/h200/fanout.sh
set -euo pipefail
nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
budget=${BUDGET:-16}; seconds=${SECONDS_PER_KERNEL:-60}
for n in ${WORKERS:-1 2}; do
  start=$(date +%s.%N)
  CACHELEVEL=0 CUDA_CACHE_DISABLE=1 python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 --budget "$budget" \
    --seconds-per-kernel "$seconds" --workers "$n" --no-judge --ledger "$OUT/ledger_w$n.sqlite" --out "$OUT/w$n" \
    --json > "$OUT/search_w$n.json" 2> "$OUT/search_w$n.err" || { tail -5 "$OUT/search_w$n.err"; exit 1; }
  echo "workers $n: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s wall" | tee -a "$OUT/wall.txt"
  rm -f "$OUT/w$n/search.json"   # the same summary as search_w$n.json
done
