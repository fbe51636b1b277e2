#!/usr/bin/env bash
# Device session of 2026-12-06 (fifteenth): decode attention at depth (issue 31). In the foreground, the generated
# attention forms alone (attention.sh: the route's lanes, lanes unrolled, and the new burst form, at depths 540,
# 4096 and 16383, then Nsight Compute at 4096); in the background, once those are done (one thing on the GPU at a
# time), the 8B-shaped file's token at depth 4096 on the recorded route (../rotary/route.json, its BEAM choices
# imported) and on the same route with the form that was fastest alone at 4096, each accounted on this GPU's target.
#   call A: bash bench/h200/s15/s15.sh start     (carry .whl)
#   call B: bash bench/h200/s15/s15.sh wait S    (models.sh's wait: S seconds at most, packs what is new into $OUT)
set -u
export RUN=/tmp/run H=bench/h200 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CACHEDB=/tmp/tinygrad_cache.db DEV=CUDA
source bench/h200/models.sh none            # stage, profile
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) export TARGET=h100-sxm ;; *) export TARGET=h200 ;; esac
FORMS="32:kernel:lanes 32:kernel:unrolled:lanes 64:kernel:unrolled:lanes 128:kernel:unrolled:lanes 32:kernel:burst \
32:kernel:unrolled:burst 64:kernel:burst 64:kernel:unrolled:burst"
case $1 in
  start)
    mkdir -p "$O" && touch "$RUN/last_pack"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    (setsid nohup bash bench/h200/s15/s15.sh run > "$O/run.log" 2>&1 < /dev/null &)
    bash bench/h200/s15/attention.sh "$O" "$FORMS" "32:kernel:lanes 32:kernel:unrolled:lanes 32:kernel:burst" 2>&1 | tee "$O/attention.log"
    touch "$O/attention.done"
    cp "$O"/attention_*.json "$O"/ncu_4096.csv "$O"/nvidia-smi.csv "$O"/attention.log "$OUT"/ ;;
  run)
    [ -e /tmp/m.gguf ] || stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
    python3 bench/h200/beam_cache.py import bench/h200/rotary/beam_cache.json
    while [ ! -e "$O/attention.done" ]; do sleep 2; done
    best=$(python3 -c "import json; f = json.load(open('$O/attention_4096.json'))['forms']; \
print(min((v['us_per_layer_median'], k) for k, v in f.items() if k != '32:kernel:lanes')[1])")
    echo "fastest alone at 4096 besides the route's: $best" | tee -a "$O/stages.txt"
    profile 8b.4096.lanes /tmp/m.gguf --context 4096 --route bench/h200/rotary/route.json
    profile 8b.4096.best /tmp/m.gguf --context 4096 --route bench/h200/rotary/route.json --split-attention "$best:rotary"
    touch "$O/run.done" ;;
  wait)
    bash bench/h200/models.sh wait "$2" ;;
esac
