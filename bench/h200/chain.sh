#!/usr/bin/env bash
# One device session's stages as one chain in the background (setsid), so that neither a device call's
# 10-minute limit nor the half-minute a machine stays warm between calls cuts a stage short: each call
# after the first only waits for the chain and brings back what it has written. After
# `source bench/h200/setup.sh`:
#   bash bench/h200/chain.sh start           copy the repo to /tmp/repo (later calls re-copy the working tree),
#                                            start the chain there, return at once
#   bash bench/h200/chain.sh wait SECONDS    wait for the chain that long at most, then pack $RUN into $OUT
#   bash bench/h200/chain.sh stop            end the chain and every stage it started (their `timeout`s included)
# The chain, each stage bench/h200/brackets.sh's: every legal gemv geometry timed alone (geometry); the
# route the search found (START_ROUTE, cold BEAM=2); then the families in FAMILIES, each searched on the
# route the last search chose (the start route where none was promoted), judged against that route's
# own trace, so no baseline is profiled twice (gemv: GEMV_FLAGS, each product timed alone first; any other
# family F: BUDGET_F settings, FutureSight's best, default 1); with FINAL=1, the last promoted route once more. Its log:
# $RUN/chain.log; done: $RUN/chain.done.
# MODEL, DEVICE, TARGET and RUN go to brackets.sh (a CPU rehearsal sets them to a tiny model).
set -u
RUN=${RUN:-/tmp/run}
export RUN
case $1 in
  start)
    mkdir -p "$RUN/out"
    rm -rf /tmp/repo && cp -r . /tmp/repo
    # LEDGER: an earlier session's ledger to go on from, so a setting it judged in the same scope is not timed again
    [ -n "${LEDGER:-}" ] && cp "$LEDGER" "$RUN/ledger.sqlite"
    (cd /tmp/repo && setsid nohup bash bench/h200/chain.sh run > "$RUN/chain.log" 2>&1 < /dev/null &)
    echo "chain started: $RUN/chain.log" ;;
  run)
    echo $$ > "$RUN/chain.pid"    # setsid made this shell its session's leader: `stop` ends the session
    export OUT=$RUN/out PYTHONPATH=${SITE:-/tmp/site}:$PWD
    B=bench/h200/brackets.sh
    # BEAM_CACHE: an earlier session's BEAM choices (its pack's beam_cache.json), so the start route's search is warm
    [ -n "${BEAM_CACHE:-}" ] && CACHEDB=${CACHEDB:-/tmp/tinygrad_cache.db} python3 bench/h200/beam_cache.py import "$BEAM_CACHE"
    on=${START_ROUTE:-bench/h200/searched/split/route.json} base=$RUN/searched.trace.json; start_on=$on
    [ -n "${SKIP_GEOMETRY:-}" ] || bash $B geometry
    LIMIT=${ROUTE_LIMIT:-900} bash $B route searched --route "$on"    # a cold BEAM took 376-502 s
    for fam in ${FAMILIES:-fusion constants_once gemv}; do
      budget=BUDGET_$fam; flags=(--budget "${!budget:-1}")    # e.g. BUDGET_split_attention=2
      [ "$fam" = gemv ] && read -ra flags <<< "${GEMV_FLAGS:---budget 2 --alone 40 --seconds-per-kernel 20}"
      LIMIT=${SEARCH_LIMIT:-600} bash $B search "$fam" --family "$fam" --on "$on" --baseline "$base" "${flags[@]}"
      if [ -e "$RUN/$fam/route.json" ]; then    # promoted: the next family goes on this route, its trace the baseline
        on=$RUN/$fam/route.json
        base=$(python3 - "$RUN/$fam" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/search.json"))
print(s["chosen_trace"])
PY
)
      fi
      echo "after $fam: on $on, baseline $base" | tee -a "$RUN/stages.txt"
    done
    # FINAL=1: the last promoted route profiled again in a fresh process (the judge's candidate ran after the search's),
    # and where the host's time goes in as many tokens more (the time before each token's first kernel)
    [ -n "${FINAL:-}" ] && [ "$on" != "$start_on" ] && LIMIT=${FINAL_LIMIT:-300} bash $B route final --route "$on" \
      --host-profile "$OUT/final.host.txt"
    touch "$RUN/chain.done" ;;
  stop)    # every process of the chain's session: its stages run under `timeout`, each in a process group of its own
    pkill -s "$(cat "$RUN/chain.pid")" && echo "chain stopped"; sleep 2 ;;
  wait)
    end=$(( $(date +%s) + $2 ))
    while [ ! -e "$RUN/chain.done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    [ -e "$RUN/chain.done" ] && echo "chain done" || echo "chain still running"
    cat "$RUN/stages.txt" 2>/dev/null; tail -3 "$RUN/chain.log"
    cp "$RUN"/out/* "$OUT"/ 2>/dev/null
    bash bench/h200/brackets.sh pack ;;
esac
