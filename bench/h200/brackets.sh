# The timing's own cost, measured apart: CUDA events around each token's launches (plain and timed),
# on the searched layout routes, and the launch facts calibrated the same way. After `source bench/h200/setup.sh`:
#   bash bench/h200/brackets.sh route NAME PROFILE-FLAGS...   boltbeam profile /tmp/m.gguf --device CUDA --context
#                                                            ${CONTEXT:-512} --tokens ${TOKENS:-24} FLAGS -> $OUT/NAME.json.gz
#   bash bench/h200/brackets.sh search NAME SEARCH-FLAGS...  boltbeam search /tmp/m.gguf --device CUDA --target h200
#                                                            --context ${CONTEXT:-512} --tokens ${TOKENS:-24} FLAGS
#                                                            --ledger /tmp/run/ledger.sqlite -> /tmp/run/NAME/ (packed)
#   bash bench/h200/brackets.sh launch                       boltbeam measure-target --launch (bracketed facts)
#   bash bench/h200/brackets.sh geometry                     bench/h200/gemv_geometry.py: every legal gemv geometry per
#                                                            product shape, checked then timed alone -> $OUT/gemv_geometry.json
#   bash bench/h200/brackets.sh pack                         summaries, logs and nvidia-smi -> $OUT/run-$(date).tgz
# tinygrad's BEAM cache lives in /tmp while the machine stays warm (216 MB: too big to bring back); its BEAM
# choices alone come back in the pack as beam_cache.json (bench/h200/beam_cache.py).
# MODEL, DEVICE, TARGET (flags) and RUN (the stages' folder, /tmp/run) default to the above; a CPU rehearsal of a plan sets them to a tiny model.
set -u
model=${MODEL:-/tmp/m.gguf} device=${DEVICE:-CUDA}
read -ra target <<< "${TARGET:---target h200}"
export DEV=$device CACHEDB=${CACHEDB:-/tmp/tinygrad_cache.db}
RUN=${RUN:-/tmp/run}
mkdir -p "$RUN"
start=$(date +%s)
case $1 in
  route)
    name=$2; shift 2
    timeout "${LIMIT:-500}" python3 -m boltbeam profile "$model" --device "$device" --context "${CONTEXT:-512}" \
      --tokens "${TOKENS:-24}" "$@" --out "$RUN/$name.trace.json" --json > "$RUN/$name.summary.json" 2> "$RUN/$name.log"
    rc=$?
    [ -e "$RUN/$name.trace.json" ] && gzip -c "$RUN/$name.trace.json" > "$OUT/$name.json.gz"
    echo "$name: rc=$rc wall=$(( $(date +%s) - start )) s; profile $*" | tee -a $RUN/stages.txt
    tail -2 "$RUN/$name.log" ;;
  search)
    name=$2; shift 2
    timeout "${LIMIT:-500}" python3 -m boltbeam search "$model" --device "$device" "${target[@]}" --context "${CONTEXT:-512}" \
      --tokens "${TOKENS:-24}" "$@" --ledger $RUN/ledger.sqlite --out "$RUN/$name" --json \
      > "$RUN/$name.search.json" 2> "$RUN/$name.log"
    echo "$name: rc=$? wall=$(( $(date +%s) - start )) s; search $*" | tee -a $RUN/stages.txt
    tail -3 "$RUN/$name.log"; head -c 1500 "$RUN/$name.search.json"; echo ;;
  launch)
    timeout "${LIMIT:-300}" python3 -m boltbeam measure-target --launch --name h200-launch --size-mb 1024 --reps 10 \
      --out $RUN/measure_target_launch.json > $RUN/h200_launch.toml 2> $RUN/launch.log
    echo "launch: rc=$? wall=$(( $(date +%s) - start )) s" | tee -a $RUN/stages.txt
    cat $RUN/h200_launch.toml; tail -2 $RUN/launch.log ;;
  geometry)
    timeout "${LIMIT:-300}" python3 bench/h200/gemv_geometry.py "$OUT/gemv_geometry.json" "${REPS:-20}" > $RUN/geometry.log 2>&1
    echo "geometry: rc=$? wall=$(( $(date +%s) - start )) s" | tee -a $RUN/stages.txt
    tail -5 $RUN/geometry.log ;;
  pack)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $RUN/nvidia-smi.csv
    python3 bench/h200/beam_cache.py export $RUN/beam_cache.json > /dev/null 2>&1    # the BEAM choices, for the next session
    tar czf "$OUT/run-$(date +%H%M).tgz" -C $RUN --exclude '*.trace.json' . ;;
esac
