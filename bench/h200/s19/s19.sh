#!/usr/bin/env bash
# Run 2026-12-07 (README.md: what came of it). Planned as one lease of ~25 minutes; the lease came after ~690 s of
# refused starts, so it ran as `MINUTES=12` and stages 3 and 4 were stopped when the device time ran out:
#  1. `boltbeam tune` on the 8B shape at 512 as issue 32 asks (fresh machine), with gemv's products timed alone
#     (--alone 64, 20 s a product), BEAM as the last step (--beam 2) and two processes a side (--processes 2);
#     the half cache left out (inconclusive at 4,096 on the H100, s17); --minutes from MINUTES (default 17);
#  2. the best recorded route at 512 (../rotary/route.json, s16's BEAM choices imported) and tune's route, each in a
#     fresh process on the same machine;
#  3. --half-cache with 64:kernel:burst:rotary at 4,096 (not reached);
#  4. the prefill's chunks timed with the layout's products fused and on weights unpacked once (not reached).
#   call A: MINUTES=12 bash bench/h200/s19/s19.sh start && bash bench/h200/s19/s19.sh wait 540    (carry .whl)
# Next (written after the run): MINUTES=20, and WORKERS=2 on an nvidia-h200-x2 (tune --workers 2), then phases.json
# says where each process's seconds went.
#   call B...: bash bench/h200/s19/s19.sh wait S
set -u
export RUN=/tmp/run H=bench/h200 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CACHEDB=/tmp/tinygrad_cache.db DEV=CUDA
source bench/h200/models.sh none            # stage, profile
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack" "$O/attention.done"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (setsid nohup bash bench/h200/s19/s19.sh run > "$O/run.log" 2>&1 < /dev/null &) ;;
  run)
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    stage tune 1500 python3 -m boltbeam tune /tmp/m.gguf --device CUDA --target $TARGET --out "$RUN/tune" \
      --ledger "$RUN/tune.sqlite" --context 512 --tokens 16 --budget 1 --minutes ${MINUTES:-17} --alone 64 \
      --seconds-per-kernel 20 --beam 2 --processes 2 --workers ${WORKERS:-1} --json \
      --families repacked_layout,split_attention,gemv,fusion,constants_once,direct_replay
    mkdir -p "$O/tune" && cp "$RUN"/tune/{route.json,tune.json,report.html} "$RUN/tune.sqlite" "$O/tune/"
    (cd "$RUN/tune" && tar czf "$O/tune/traces.tgz" traces)
    python3 bench/h200/phases.py "$RUN/tune/traces" "$O/tune/phases.json"     # (after s19's run: the traces' phases)
    [ -e "$RUN/tune/route.json" ] && profile 8b.512.tuned /tmp/m.gguf --context 512 --route "$RUN/tune/route.json"
    python3 bench/h200/beam_cache.py import bench/h200/s16/run/beam_cache.json
    profile 8b.512.best /tmp/m.gguf --context 512 --route bench/h200/rotary/route.json
    profile 8b.4096.half.burst64 /tmp/m.gguf --context 4096 --route bench/h200/rotary/route.json --half-cache \
      --split-attention 64:kernel:burst:rotary
    for variant in fused materialized; do
      stage prefill.$variant 300 python3 bench/h200/prefill.py /tmp/m.gguf bench/h200/rotary/route.json 512 $variant \
        "$O/prefill_$variant.json"
    done
    kill %1; touch "$O/run.done" ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
