#!/usr/bin/env bash
# Planned for the next lease (written 2026-12-07 in the twenty-second session, not yet run): s22 again with that
# session's tune. FutureSight's ties now go to fewer kernels (the H100 target has no measured cost of a kernel, and
# s22's tune took the unstacked layout, split attention without rotary and fusion `inplace` alone: 876 kernels a
# token against the best route's 534, 1.139x its token), and tune goes in rounds (no --budget: every family's best,
# then each one's next best while the minutes last, time kept for BEAM's step).
#  1. the best recorded route at 512 (../rotary/route.json, s16's BEAM choices imported) in caches of its own;
#  2. `boltbeam tune` on the 8B shape at 512 from empty caches, --minutes from MINUTES, rounds, BEAM 2 last;
#  3. tune's route in a fresh process.
#   call A: MINUTES=18 bash bench/h200/s23/s23.sh start && bash bench/h200/s23/s23.sh wait 520   (carry .whl)
#   call B...: bash bench/h200/s23/s23.sh wait S
# Then, where a lease has ~5 minutes to spare: the cost of a kernel on the H100, which h100-sxm lacks
# (`launch_sync_per_kernel`; on the H200 this took 155 s, bench/h200/brackets/):
#   bash bench/h200/s23/s23.sh launch     (carry .whl)
set -u
export RUN=/tmp/run PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD DEV=CUDA
source bench/h200/models.sh none            # stage, profile; O=$RUN/out
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (MINUTES=${MINUTES:-18} setsid nohup bash bench/h200/s23/s23.sh run > "$O/run.log" 2>&1 < /dev/null &) ;;
  run)
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    (export CACHEDB=/tmp/best_cache.db XDG_CACHE_HOME=/tmp/best_home
     python3 bench/h200/beam_cache.py import bench/h200/s16/run/beam_cache.json
     profile 8b.512.best /tmp/m.gguf --context 512 --route bench/h200/rotary/route.json)
    export CACHEDB=/tmp/tinygrad_cache.db XDG_CACHE_HOME=/tmp/tune_home
    stage tune 1800 python3 -m boltbeam tune /tmp/m.gguf --device CUDA --target $TARGET --out "$RUN/tune" \
      --ledger "$RUN/tune.sqlite" --context 512 --tokens 16 --minutes $MINUTES --alone 64 \
      --seconds-per-kernel 20 --beam 2 --processes 2 --decisive 10 --json \
      --families repacked_layout,split_attention,gemv,fusion,constants_once,direct_replay
    mkdir -p "$O/tune" && cp "$RUN"/tune/{route.json,tune.json,report.html} "$RUN/tune.sqlite" "$O/tune/"
    python3 bench/h200/phases.py "$RUN/tune/traces" "$O/tune/phases.json"
    [ -e "$RUN/tune/route.json" ] && profile 8b.512.tuned /tmp/m.gguf --context 512 --route "$RUN/tune/route.json"
    rm -f "$O"/*.json.gz
    python3 bench/h200/phases.py $RUN "$O/phases.json"
    kill %1; touch "$O/run.done" ;;
  launch)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/nvidia-smi.csv"
    python3 -m boltbeam measure-target --launch --name "$TARGET-launch" --size-mb 1024 --reps 10 \
      --out "$OUT/measure_target_launch.json" > "$OUT/launch.toml" ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
