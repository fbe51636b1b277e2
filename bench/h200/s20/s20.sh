#!/usr/bin/env bash
# Run 2026-12-07 (twentieth session), call A: where a tune process's seconds go on the 8B shape at 512, one GPU.
#  1. the layout tune promotes first (float16:kernel), profiled twice (the first repacks and caches the planes);
#     each trace's phases; the second again under cProfile;
#  2. s19's tuned route (../s19/run/tune/route.json) profiled: its phases;
#  3. gemv's two biggest product shapes timed alone (32 geometries, 15 s each) under cProfile.
#   call A: bash bench/h200/s20/s20.sh measure          (carry .whl)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CACHEDB=/tmp/tinygrad_cache.db DEV=CUDA RUN=/tmp/run
export O=$OUT
source bench/h200/models.sh none            # stage, profile
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
case $1 in
  measure)
    mkdir -p $RUN
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia-smi.csv"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    profile layout.1 /tmp/m.gguf --context 512 --layout float16:kernel
    profile layout.2 /tmp/m.gguf --context 512 --layout float16:kernel
    stage layout.3.cprofile 400 python3 -m cProfile -o "$O/layout.3.prof" -m boltbeam profile /tmp/m.gguf --device CUDA \
      --tokens 16 --no-hash --context 512 --layout float16:kernel --out "$RUN/layout.3.trace.json" --json
    profile tuned /tmp/m.gguf --context 512 --route bench/h200/s19/run/tune/route.json
    stage alone.cprofile 200 python3 -m cProfile -o "$O/alone.prof" bench/h200/s20/alone_prof.py /tmp/m.gguf $TARGET 32 15 2
    rm -f "$O"/*.json.gz; kill %1 ;;
esac
