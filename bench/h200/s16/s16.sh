#!/usr/bin/env bash
# Device session of 2026-12-06 (sixteenth): burst on the whole token, and its new combine (issue 31). In the
# foreground, the lanes and burst forms alone at chunks of 32 and 64 (../s15/attention.sh: depths 540, 4096 and
# 16383), then Nsight Compute at 4096 on the chunk-64 pair (burst now combines with spread_combine, lanes with
# lanes_combine: the same chunk count, so the two combines compare); in the background, once those are done, the
# 8B-shaped file's token on the recorded route (../rotary/route.json, its BEAM choices imported) and on the route
# with 64:kernel:burst:rotary, at depth 4096 then 512, each accounted on this GPU's target; then the BEAM choices
# this run made, exported (the 4096-depth kernels' included).
#   call A: bash bench/h200/s16/s16.sh start     (carry .whl)
#   call B...: bash bench/h200/s16/s16.sh wait S   (models.sh's wait: S seconds at most, packs what is new into $OUT)
set -u
export RUN=/tmp/run H=bench/h200 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CACHEDB=/tmp/tinygrad_cache.db DEV=CUDA
source bench/h200/models.sh none            # stage, profile
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
FORMS="32:kernel:lanes 64:kernel:lanes 32:kernel:burst 64:kernel:burst 64:kernel:unrolled:burst"
BURST=64:kernel:burst:rotary
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (setsid nohup bash bench/h200/s16/s16.sh run > "$O/run.log" 2>&1 < /dev/null &)
    NCU_EXTRA="--section MemoryWorkloadAnalysis --section SchedulerStats" bash bench/h200/s15/attention.sh "$O" "$FORMS" \
      "64:kernel:lanes 64:kernel:burst 64:kernel:unrolled:burst" 2>&1 | tee "$O/attention.log"
    touch "$O/attention.done"
    cp "$O"/attention_*.json "$O"/ncu_4096.csv "$O"/nvidia-smi.csv "$O"/attention.log "$OUT"/ ;;
  run)
    [ -e /tmp/m.gguf ] || stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    python3 bench/h200/beam_cache.py import bench/h200/rotary/beam_cache.json
    while [ ! -e "$O/attention.done" ]; do sleep 2; done
    for depth in 4096 512; do
      profile 8b.$depth.lanes /tmp/m.gguf --context $depth --route bench/h200/rotary/route.json
      profile 8b.$depth.burst /tmp/m.gguf --context $depth --route bench/h200/rotary/route.json --split-attention $BURST
    done
    python3 bench/h200/beam_cache.py export "$O/beam_cache.json"
    touch "$O/run.done" ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
