#!/usr/bin/env bash
# Planned for the next device session (written 2026-12-06, not yet run): the float16 KV cache (`--half-cache`,
# issue 31) on the whole token. First the attention forms alone at depth 4096 on a float32 cache (the model's now)
# and a float16 one (attention_kernels.py, a cache of 4,160 positions, about the model's at that depth). In the
# background, the 8B-shaped file's token on the recorded route
# (../rotary/route.json, its BEAM choices imported from ../s16/run/beam_cache.json) at depth 4096: the route as it
# is, with --half-cache, with --half-cache and 64:kernel:burst:rotary (its values fit local memory in float16); then
# depth 512, the route and --half-cache; then the route and the route with --half-cache at 4096 again (a second
# process each: s16 saw 2.4% between two processes of one route), last, as what a short session can lose. Each accounted on this GPU's target (~200 s a profile at 4096,
# ~125 at 512: ~1,250 s in all). The greedy tokens of each trace (`output_tokens`) are compared with the route's own.
#   call A: bash bench/h200/s17/s17.sh start     (carry .whl)
#   call B...: bash bench/h200/s17/s17.sh wait S   (models.sh's wait: S seconds at most, packs what is new into $OUT)
#   a second lease: bash bench/h200/s17/s17.sh again (carry .whl), then wait calls
set -u
export RUN=/tmp/run H=bench/h200 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CACHEDB=/tmp/tinygrad_cache.db DEV=CUDA
source bench/h200/models.sh none            # stage, profile, ready
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
ROUTE=(--route bench/h200/rotary/route.json)
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (setsid nohup bash bench/h200/s17/s17.sh run > "$O/run.log" 2>&1 < /dev/null &)
    for cache in float32 float16; do      # the forms alone on each cache (the background waits for these); burst's
      # chunk of 64 fits a group's local memory only on float16 (on float32 the script stopped at it, lease 1)
      forms="32:kernel:lanes 32:kernel:burst"; [ $cache = float16 ] && forms="$forms 64:kernel:burst"
      CACHE=$cache FORMS="$forms" timeout 200 python3 \
        bench/h200/attention_kernels.py "$O/attention_${cache}_4096.json" 8 4 128 4160 4096 36 50 2>&1 | tail -4
    done
    touch "$O/attention.done"; cp "$O"/attention_*.json "$OUT"/ ;;
  run)
    # the GPU's memory and use each second beside the stages' times: where a profile's 120-250 s go (loading,
    # prefill, decode), which s16 could not tell
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    ready bench/h200/s16/run/beam_cache.json
    profile 8b.4096.route /tmp/m.gguf --context 4096 "${ROUTE[@]}"
    profile 8b.4096.half /tmp/m.gguf --context 4096 "${ROUTE[@]}" --half-cache
    profile 8b.4096.half.burst64 /tmp/m.gguf --context 4096 "${ROUTE[@]}" --half-cache --split-attention 64:kernel:burst:rotary
    profile 8b.512.route /tmp/m.gguf --context 512 "${ROUTE[@]}"
    profile 8b.512.half /tmp/m.gguf --context 512 "${ROUTE[@]}" --half-cache
    profile 8b.4096.route2 /tmp/m.gguf --context 4096 "${ROUTE[@]}"
    profile 8b.4096.half2 /tmp/m.gguf --context 4096 "${ROUTE[@]}" --half-cache
    kill %1; touch "$O/run.done" ;;
  again)    # the second lease (H100): run's half-cache profiles failed to compile (the prefill's store into the
            # float16 cache carried no cast); with the cast, the half cache at 4096, the route again, the half again
    mkdir -p "$O" && touch "$RUN/last_pack" "$O/attention.done"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (setsid nohup bash bench/h200/s17/s17.sh half > "$O/run.log" 2>&1 < /dev/null &) ;;
  half)
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 > "$O/gpu_seconds.csv" &
    ready bench/h200/s16/run/beam_cache.json
    # the first writes the repacked planes to the cache folder (route/planes_cache.py), the next two read them back;
    # where a read-back run fails, it runs again with the cache off
    profile 8b.4096.half /tmp/m.gguf --context 4096 "${ROUTE[@]}" --half-cache
    profile 8b.4096.route2 /tmp/m.gguf --context 4096 "${ROUTE[@]}"
    [ -e "$RUN/8b.4096.route2.trace.json" ] || BOLTBEAM_PLANES_CACHE=off profile 8b.4096.route2off /tmp/m.gguf --context 4096 "${ROUTE[@]}"
    profile 8b.4096.half2 /tmp/m.gguf --context 4096 "${ROUTE[@]}" --half-cache
    ls -la ~/.cache/boltbeam/planes > "$O/planes_cache.txt" 2>&1
    kill %1; touch "$O/run.done" ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
