#!/usr/bin/env bash
# Run 2026-12-07 (twenty-first session): issue 32's "done when" on one GPU, after s20's cuts to a tune process
# (gemv's products alone compiled by a pool, a long prompt stepped through the decode, the planes repacked a block at
# a time) and this session's (a verdict's later processes run only where its first pair moved the token by under 10%,
# tune --decisive):
#  1. `boltbeam tune` on the 8B shape at 512 from empty caches, as s19 ran it, every family and BEAM 2 last, two
#     processes a side, --minutes from MINUTES (no setting starts after it; the one running finishes); each
#     process's phases (phases.py);
#  2. the best recorded route at 512 (../rotary/route.json, s16's BEAM choices imported), in caches of its own (its
#     own tinygrad CACHEDB and XDG_CACHE_HOME), so nothing it compiles, searches or repacks reaches tune's; then
#     tune's route in a fresh process: both where the time is left.
#   call A: MINUTES=11 bash bench/h200/s21/s21.sh start && bash bench/h200/s21/s21.sh wait 530   (carry .whl)
#   call B...: bash bench/h200/s21/s21.sh wait S
# Fallback, where the device time left cannot hold a tune (five refused starts cost ~900 s): s20's two cuts not yet
# measured on a GPU, in one call of ~5 minutes: the layout's first process (its planes repacked a block at a time,
# the 512-token prompt prefilled in one call) and s19's tuned route (the prompt stepped through its ~6 ms decode);
# each trace's phases against s20's run_a and run_b.
#   bash bench/h200/s21/s21.sh cuts                (carry .whl)
set -u
export RUN=/tmp/run PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD DEV=CUDA
source bench/h200/models.sh none            # stage, profile; O=$RUN/out
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (MINUTES=${MINUTES:-17} setsid nohup bash bench/h200/s21/s21.sh run > "$O/run.log" 2>&1 < /dev/null &) ;;
  run)
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    export CACHEDB=/tmp/tinygrad_cache.db XDG_CACHE_HOME=/tmp/tune_home
    stage tune 1800 python3 -m boltbeam tune /tmp/m.gguf --device CUDA --target $TARGET --out "$RUN/tune" \
      --ledger "$RUN/tune.sqlite" --context 512 --tokens 16 --budget 1 --minutes $MINUTES --alone 64 \
      --seconds-per-kernel 20 --beam 2 --processes 2 --decisive 10 --json \
      --families repacked_layout,split_attention,gemv,fusion,constants_once,direct_replay
    mkdir -p "$O/tune" && cp "$RUN"/tune/{route.json,tune.json,report.html} "$RUN/tune.sqlite" "$O/tune/"
    python3 bench/h200/phases.py "$RUN/tune/traces" "$O/tune/phases.json"
    (cd "$RUN/tune" && find traces -name '*.json' -size -2M | tar czf "$O/tune/routes.tgz" -T -)
    (export CACHEDB=/tmp/best_cache.db XDG_CACHE_HOME=/tmp/best_home
     python3 bench/h200/beam_cache.py import bench/h200/s16/run/beam_cache.json
     profile 8b.512.best /tmp/m.gguf --context 512 --route bench/h200/rotary/route.json)
    [ -e "$RUN/tune/route.json" ] && profile 8b.512.tuned /tmp/m.gguf --context 512 --route "$RUN/tune/route.json"
    kill %1; touch "$O/run.done" ;;
  cuts)
    export O=$OUT CACHEDB=/tmp/tinygrad_cache.db XDG_CACHE_HOME=/tmp/cuts_home
    mkdir -p $RUN
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia-smi.csv"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    profile layout.first /tmp/m.gguf --context 512 --layout float16:kernel
    profile tuned.s19 /tmp/m.gguf --context 512 --route bench/h200/s19/run/tune/route.json
    rm -f "$O"/*.json.gz
    python3 bench/h200/phases.py $RUN "$O/phases.json"
    kill %1 ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
