#!/usr/bin/env bash
# Run 2026-12-07 (twentieth session), call A: where a tune process's seconds go on the 8B shape at 512, one GPU.
#  1. the layout tune promotes first (float16:kernel), profiled twice (the first repacks and caches the planes);
#     each trace's phases; the second again under cProfile;
#  2. s19's tuned route (../s19/run/tune/route.json) profiled: its phases;
#  3. gemv's two biggest product shapes timed alone (32 geometries, 15 s each) under cProfile, compiled here one at
#     a time; then the same with 15 processes compiling beside it (search/compiler.py's compile_pool).
#   call A: bash bench/h200/s20/s20.sh measure          (carry .whl)
#   (it ran past the 600 s limit in its last stage, and $OUT came back with 8 of its files: README.md says what was
#   fetched after, by hand, from the still-warm machine)
# Call B, after the changes call A pointed to (a 512-token prompt prefilled in one call, not 16; gemv's products alone
# compiled by 15 processes beside the one that times, on buffers filled once a kernel):
#  1. the layout profiled (the first process: it repacks), and s19's tuned route: their phases against call A's;
#  2. all seven of gemv's product shapes timed alone as tune times them (64 geometries, 20 s each at most);
#  3. bench/h200/prefill.py at 512 tokens on s19's tuned route, the layout's products fused and materialized.
#   call B: bash bench/h200/s20/s20.sh validate         (carry .whl)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CACHEDB=/tmp/tinygrad_cache.db DEV=CUDA RUN=/tmp/run
source bench/h200/models.sh none            # stage, profile
export O=$OUT                               # (after models.sh, which sets its own)
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
    stage alone.cprofile 200 python3 -m cProfile -o "$O/alone.prof" bench/h200/s20/alone_prof.py /tmp/m.gguf $TARGET 32 15 2 0
    stage alone.pool 200 python3 bench/h200/s20/alone_prof.py /tmp/m.gguf $TARGET 32 15 2 15
    rm -f "$O"/*.json.gz; kill %1 ;;
  validate)       # the run in the background; what it has written by 530 s comes back either way
    mkdir -p $RUN/b && (setsid nohup bash bench/h200/s20/s20.sh validate_run > $RUN/b/run.log 2>&1 < /dev/null &)
    end=$(( $(date +%s) + 530 ))
    while [ ! -e $RUN/b/run.done ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    cat $RUN/b/stages.txt; rm -f $RUN/b/*.json.gz; tar czf $OUT/b.tgz -C $RUN/b . ;;
  validate_run)
    export O=$RUN/b
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia-smi.csv"
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    [ -e /tmp/m.gguf ] || stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    profile layout.new /tmp/m.gguf --context 512 --layout float16:kernel
    profile tuned.new /tmp/m.gguf --context 512 --route bench/h200/s19/run/tune/route.json
    stage alone.all 240 python3 bench/h200/s20/alone_prof.py /tmp/m.gguf $TARGET 64 20 7 15
    for variant in fused materialized; do
      stage prefill.$variant 150 python3 bench/h200/prefill.py /tmp/m.gguf bench/h200/s19/run/tune/route.json 512 \
        $variant "$O/prefill_$variant.json"
    done
    python3 bench/h200/phases.py $RUN $O/phases.json
    kill %1; touch $O/run.done ;;
esac
