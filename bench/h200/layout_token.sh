# The whole decode token on the generated layout with tinygrad's BEAM=2 choosing every kernel's opts,
# after `source bench/h200/setup.sh`. BEAM's results persist in tinygrad's cache database, carried
# in and out as .cache/tinygrad.db, so a search cut short by the call's limit resumes in the next call.
#   LAYOUT=float16:expanded LIMIT=480 bash bench/h200/layout_token.sh
set -u
export DEV=CUDA CACHEDB=/tmp/tinygrad_cache.db
[ -e .cache/tinygrad.db ] && cp .cache/tinygrad.db "$CACHEDB"
layout=${LAYOUT:-float16:expanded}
start=$(date +%s)
timeout "${LIMIT:-480}" python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 --tokens 8 \
  --layout "$layout" --beam 2 --no-hash --out "$OUT/layout_beam2.json" --json > "$OUT/layout_beam2.log" 2>&1
echo "rc=$? wall=$(( $(date +%s) - start )) s" | tee "$OUT/layout_beam2.rc"
tail -5 "$OUT/layout_beam2.log"
cp "$CACHEDB" "$OUT/tinygrad.db"
