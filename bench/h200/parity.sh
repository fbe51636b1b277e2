#!/usr/bin/env bash
# llama.cpp and tinygrad routes on one machine, each profiled in a process of its own at depth 512, in the
# background (as chain.sh's stages are), so the 5-10% that a route's wall moves between machines does not
# enter the comparison. After `source bench/h200/setup.sh` (which starts the llama.cpp build):
#   bash bench/h200/parity.sh start NAME='PROFILE-FLAGS' ...   llama.cpp once the build is done, then each NAME
#                                                             with its flags (brackets.sh route), in order
#   bash bench/h200/chain.sh wait SECONDS                     wait for it, pack $RUN into $OUT
# BEAM_CACHE: an earlier session's BEAM choices, imported before anything compiles.
set -u
RUN=${RUN:-/tmp/run}
export RUN
case $1 in
  start)
    shift
    mkdir -p "$RUN/out"
    rm -rf /tmp/repo && cp -r . /tmp/repo
    (cd /tmp/repo && setsid nohup bash bench/h200/parity.sh run "$@" > "$RUN/chain.log" 2>&1 < /dev/null &)
    echo "parity started: $RUN/chain.log" ;;
  run)
    shift
    echo $$ > "$RUN/chain.pid"
    export OUT=$RUN/out PYTHONPATH=${SITE:-/tmp/site}:$PWD:$PWD/.llama
    [ -n "${BEAM_CACHE:-}" ] && CACHEDB=${CACHEDB:-/tmp/tinygrad_cache.db} python3 bench/h200/beam_cache.py import "$BEAM_CACHE"
    while [ ! -e /tmp/llama-build.done ]; do    # (the build runs on every core: nothing is timed beside it)
      if ! pgrep -f "cmake --build /tmp/lb" > /dev/null; then tail -20 /tmp/llama-build.log; break; fi
      sleep 5
    done
    echo "llama.cpp built: $(date +%T)" | tee -a "$RUN/stages.txt"
    LIMIT=300 bash bench/h200/brackets.sh route llama --engine llama.cpp
    for stage in "$@"; do
      read -ra flags <<< "${stage#*=}"
      LIMIT=${ROUTE_LIMIT:-500} bash bench/h200/brackets.sh route "${stage%%=*}" "${flags[@]}"
    done
    touch "$RUN/chain.done" ;;
esac
