#!/usr/bin/env bash
# The depth sweep on the H200: llama.cpp, then the route, at each depth, each profile in a process of its own
# (`boltbeam sweep`), in the background (setsid) so a device call's 10 minutes do not cut it short. After
# `source bench/h200/setup.sh` (which starts llama.cpp's build and writes the 8B-shaped model):
#   bash bench/h200/sweep.sh start 512,4096,16384   copy the repo to /tmp/repo, start the sweeps there, return
#   bash bench/h200/sweep.sh wait SECONDS           wait for them that long at most, then pack $RUN into $OUT
# ROUTE (default bench/h200/rotary/route.json), BEAM_CACHE (an earlier session's BEAM choices for it), TOKENS
# (default 16). Nothing is timed while llama.cpp builds: the build takes every core.
set -u
RUN=${RUN:-/tmp/run}
export RUN
case $1 in
  start)
    mkdir -p "$RUN"
    rm -rf /tmp/repo && cp -r . /tmp/repo
    (cd /tmp/repo && setsid nohup bash bench/h200/sweep.sh run "$2" > "$RUN/sweep.log" 2>&1 < /dev/null &)
    echo "sweep started: $RUN/sweep.log" ;;
  run)
    export PYTHONPATH=${SITE:-/tmp/site}:$PWD:$PWD/.llama
    [ -n "${BEAM_CACHE:-}" ] && CACHEDB=${CACHEDB:-/tmp/tinygrad_cache.db} python3 bench/h200/beam_cache.py import "$BEAM_CACHE"
    while [ ! -e /tmp/llama-build.done ]; do
      if ! pgrep -f "cmake --build /tmp/lb" > /dev/null; then tail -20 /tmp/llama-build.log; break; fi
      sleep 5
    done
    echo "llama.cpp built: $(date +%T)"
    tokens=${TOKENS:-16}
    python3 -m boltbeam sweep /tmp/m.gguf --device CUDA --engine llama.cpp --contexts "$2" --tokens "$tokens" \
      --out "$RUN/llama"
    echo "llama.cpp swept: $(date +%T)"
    compare=(); [ -e "$RUN/llama/sweep.json" ] && compare=(--compare "$RUN/llama/sweep.json")
    python3 -m boltbeam sweep /tmp/m.gguf --device CUDA --contexts "$2" --tokens "$tokens" \
      --route "${ROUTE:-bench/h200/rotary/route.json}" --out "$RUN/route" "${compare[@]}"
    echo "route swept: $(date +%T)"
    touch "$RUN/sweep.done" ;;
  wait)
    end=$(( $(date +%s) + $2 ))
    while [ ! -e "$RUN/sweep.done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    [ -e "$RUN/sweep.done" ] && echo "sweep done" || echo "sweep still running"
    tail -25 "$RUN/sweep.log"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$RUN/nvidia-smi.csv"
    python3 bench/h200/beam_cache.py export "$RUN/beam_cache.json" > /dev/null 2>&1
    tar czf "$OUT/sweep-$(date +%H%M).tgz" -C "$RUN" . ;;
esac
