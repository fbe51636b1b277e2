# BoltBeam's search on the H200, after `source bench/h200/setup.sh`: the 8B-shaped model at KV depth 512,
# tinygrad's own opts family, the whole token judged with and without the route; then the same
# search again on the same ledger (it should time nothing new). Everything lands in $OUT.
set -euo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
budget=${BUDGET:-8}
start=$(date +%s)
python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 --budget "$budget" \
  --seconds-per-kernel 15 --tokens 8 --ledger /tmp/ledger.sqlite --out "$OUT/search" --json > "$OUT/search.json"
echo "first search: $(( $(date +%s) - start )) s wall" | tee "$OUT/wall.txt"
start=$(date +%s)
python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 --budget "$budget" \
  --seconds-per-kernel 15 --ledger /tmp/ledger.sqlite --out "$OUT/search_again" --no-judge --json > "$OUT/search_again.json"
echo "second search: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/wall.txt"
cp /tmp/ledger.sqlite "$OUT/ledger.sqlite"
