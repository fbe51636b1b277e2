#!/usr/bin/env bash
# Run 2026-12-07 (twenty-second session): issue 32's "done when" on one GPU. s21's plan, reordered so that the
# comparison lands even if the lease ends early:
#  1. the best recorded route at 512 (../rotary/route.json, s16's BEAM choices imported) in caches of its own (its
#     own tinygrad CACHEDB and XDG_CACHE_HOME), so nothing it compiles, searches or repacks reaches tune's;
#  2. `boltbeam tune` on the 8B shape at 512 from empty caches, every family and BEAM 2 last, two processes a side,
#     a verdict settled by its first pair where that moved the token 10% or more (--decisive 10), --minutes from
#     MINUTES (no setting starts after it; the one running finishes); each process's phases (phases.py);
#  3. tune's route in a fresh process (the prompt stepped through the decode, 9bba660, on a GPU for the first time).
#   call A: MINUTES=18 bash bench/h200/s22/s22.sh start && bash bench/h200/s22/s22.sh wait 520   (carry .whl)
#   call B...: bash bench/h200/s22/s22.sh wait S
set -u
export RUN=/tmp/run PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD DEV=CUDA
source bench/h200/models.sh none            # stage, profile; O=$RUN/out
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (MINUTES=${MINUTES:-18} setsid nohup bash bench/h200/s22/s22.sh run > "$O/run.log" 2>&1 < /dev/null &) ;;
  run)
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    (export CACHEDB=/tmp/best_cache.db XDG_CACHE_HOME=/tmp/best_home
     python3 bench/h200/beam_cache.py import bench/h200/s16/run/beam_cache.json
     profile 8b.512.best /tmp/m.gguf --context 512 --route bench/h200/rotary/route.json)
    export CACHEDB=/tmp/tinygrad_cache.db XDG_CACHE_HOME=/tmp/tune_home
    stage tune 1800 python3 -m boltbeam tune /tmp/m.gguf --device CUDA --target $TARGET --out "$RUN/tune" \
      --ledger "$RUN/tune.sqlite" --context 512 --tokens 16 --budget 1 --minutes $MINUTES --alone 64 \
      --seconds-per-kernel 20 --beam 2 --processes 2 --decisive 10 --json \
      --families repacked_layout,split_attention,gemv,fusion,constants_once,direct_replay
    mkdir -p "$O/tune" && cp "$RUN"/tune/{route.json,tune.json,report.html} "$RUN/tune.sqlite" "$O/tune/"
    python3 bench/h200/phases.py "$RUN/tune/traces" "$O/tune/phases.json"
    [ -e "$RUN/tune/route.json" ] && profile 8b.512.tuned /tmp/m.gguf --context 512 --route "$RUN/tune/route.json"
    rm -f "$O"/*.json.gz
    python3 bench/h200/phases.py $RUN "$O/phases.json"
    kill %1; touch "$O/run.done" ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
