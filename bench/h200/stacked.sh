# The searched layout route with BEAM=2 on the H200, at depth 512, after `source bench/h200/setup.sh`.
# BEAM's choices persist in tinygrad's cache database, carried in as .cache/tinygrad.db and back out
# in $OUT, so each stage reuses what the earlier ones searched, on a warm machine or a fresh one.
#   bash bench/h200/stacked.sh baseline   the default route with BEAM=2 -> $OUT/beam2.json
#   bash bench/h200/stacked.sh search     search --family repacked_layout --beam 2 --budget ${BUDGET:-1}
#                                         against bench/h200/stacked/beam2.json -> $OUT/search/
#   bash bench/h200/stacked.sh split      the chosen route with split attention (chunks of ${CHUNK:-16})
#   bash bench/h200/stacked.sh separate   the same layout unstacked (float16:expanded), BEAM=2
#   bash bench/h200/stacked.sh splits     search --family split_attention --on the chosen route, BEAM=2,
#                                         --budget ${BUDGET:-1}, against a profile of that route made first
set -u
export DEV=CUDA CACHEDB=/tmp/tinygrad_cache.db
[ -e .cache/tinygrad.db ] && [ ! -e "$CACHEDB" ] && cp .cache/tinygrad.db "$CACHEDB"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
start=$(date +%s)
case $1 in
  baseline)
    timeout "${LIMIT:-500}" python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 --tokens 8 --beam 2 \
      --out "$OUT/beam2.json" --json > "$OUT/beam2.summary.json" 2> "$OUT/beam2.log" ;;
  search)
    timeout "${LIMIT:-500}" python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 \
      --tokens 8 --family repacked_layout --beam 2 --budget "${BUDGET:-1}" --baseline bench/h200/stacked/beam2.json \
      --ledger "$OUT/ledger.sqlite" --out "$OUT/search" --json > "$OUT/search.json" 2> "$OUT/search.log" ;;
  split)
    timeout "${LIMIT:-500}" python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 --tokens 8 \
      --route bench/h200/stacked/search/route.json --split-attention "${CHUNK:-16}" \
      --out "$OUT/split${CHUNK:-16}.json" --json > "$OUT/split.summary.json" 2> "$OUT/split.log" ;;
  splits)
    timeout "${LIMIT:-500}" python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 \
      --tokens 8 --family split_attention --on bench/h200/stacked/search/route.json --beam 2 --budget "${BUDGET:-1}" \
      --ledger "$OUT/ledger.sqlite" --out "$OUT/splits" --json > "$OUT/splits.json" 2> "$OUT/splits.log" ;;
  separate)
    timeout "${LIMIT:-500}" python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 --tokens 8 --beam 2 \
      --layout float16:expanded --out "$OUT/separate.json" --json > "$OUT/separate.summary.json" 2> "$OUT/separate.log" ;;
esac
echo "$1: rc=$? wall=$(( $(date +%s) - start )) s" | tee "$OUT/$1.rc"
tail -3 "$OUT"/*.log
cp "$CACHEDB" "$OUT/tinygrad.db"
