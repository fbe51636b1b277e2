# BoltBeam's search on the H200, after `source bench/h200/setup.sh`: the 8B-shaped model at KV depth 512,
# tinygrad's own opts family, the whole token judged with and without the route; then the same
# search again on the same ledger (it should time nothing new). Everything lands in $OUT.
#   BUDGET=16 SECONDS=10 bash bench/h200/search.sh
set -euo pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
budget=${BUDGET:-8}; seconds=${SECONDS_PER_KERNEL:-15}
ledger=/tmp/ledger_$(date +%s).sqlite
start=$(date +%s)
python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 --budget "$budget" \
  --seconds-per-kernel "$seconds" --tokens 8 --ledger "$ledger" --out "$OUT/search" --json > "$OUT/search.json"
echo "first search: $(( $(date +%s) - start )) s wall" | tee "$OUT/wall.txt"
start=$(date +%s)
python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 --budget "$budget" \
  --seconds-per-kernel "$seconds" --ledger "$ledger" --out "$OUT/again" --no-judge --json > "$OUT/search_again.json"
echo "second search: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/wall.txt"
cp "$ledger" "$OUT/ledger.sqlite"
rm -f "$OUT/search/search.json" "$OUT/again/search.json"   # the same summaries as the two .json files above
