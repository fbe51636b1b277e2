#!/usr/bin/env bash
# One device session's checks (2026-12-05), in order of what matters most, each result packed as it lands:
#  1. real models beside llama.cpp (issue 34): Gemma 3 270M Q4_K_M and SmolLM2-135M Q4_1, greedy tokens of
#     tinygrad.llm as it loads the file, of BoltBeam's adapter and of the adapter with the route families, against
#     llama.cpp's CUDA build on the same prompt ids; then each token timed at depth 512 (llama.cpp, the default
#     route, the families as flags), tinygrad's runs with `profile --reference` (llama.cpp's greedy tokens beside);
#  2. the accounts at depth 512 (issue 35): the 8B-shaped file's default route, the best recorded route
#     (../rotary/route.json, its BEAM choices imported) and llama.cpp, each accounted on the device;
#  3. `boltbeam tune` on SmolLM2 (issues 32, 34), then its route profiled with --reference;
#  4. the accounts at depth 4096; 5. `tune` on Gemma 3.
# The two model files reach the device as the chunks of `cat GEMMA SMOL | split -b 58M -d -a 1 - .carry/models.`
# (a call carries 64 MiB with the working tree), one a call, with bench/h200 (45 MB) moved aside here and this
# folder's few files the run reads copied to .carry/device (H). Calls, back to back (the machine is released
# after 30 s idle):
#   H=.carry/device bash .carry/device/models.sh chunk N     (carry .carry/models.N) keep chunk N in /tmp/models
#   source .carry/device/setup.sh && H=.carry/device bash .carry/device/models.sh start
#                                (carry .whl .llama.tar.xz .carry/device .carry/models.5) join, check, start `run`
#   H=.carry/device bash .carry/device/models.sh wait S      wait S seconds at most, pack what is new into $OUT
set -u
H=${H:-bench/h200}
RUN=${RUN:-/tmp/run}
M=/tmp/models
GEMMA=$M/gemma-3-270m-q4_k_m.gguf GEMMA_BYTES=253113024
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
SMOL=$M/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
EIGHT_B=/tmp/m.gguf
# the families SmolLM2's route was given as flags in issue 31 (its BEAM left out: minutes of search a model)
FAMILIES=(--layout float16:kernel:stacked --split-attention 32:kernel:lanes:rotary --constants-once --direct-replay
          --fusion gated+inplace)
CHECK_FAMILIES=(--family layout=float16:kernel:stacked --family split_attention=32:kernel:lanes:rotary
                --family constants_once=1 --family direct_replay=1 --family fusion=gated+inplace)
export RUN H
O=$RUN/out

stage() {     # stage NAME LIMIT COMMAND...: its output in $O/NAME.txt, a line in stages.txt
  local name=$1 limit=$2 start
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" > "$O/$name.txt" 2>&1
  echo "$name: rc=$? $(( $(date +%s) - start )) s, at $(date +%T): $*" | tee -a "$O/stages.txt"
}

profile() {   # profile NAME MODEL FLAGS...: the trace (gzipped) and its account on $TARGET (h200 unless set)
  local name=$1 model=$2
  shift 2
  stage "$name" 600 python3 -m boltbeam profile "$model" --device CUDA --tokens 16 --no-hash "$@" \
    --out "$RUN/$name.trace.json" --json
  [ -e "$RUN/$name.trace.json" ] || return
  gzip -c "$RUN/$name.trace.json" > "$O/$name.json.gz"
  stage "$name.account" 120 python3 -m boltbeam account "$RUN/$name.trace.json" --model "$model" --no-hash-check \
    --target ${TARGET:-h200} --json
}

ready() {     # ready BEAM_JSON: the 8B-shaped file written here if missing, BEAM's carried choices imported, and the
              # foreground's kernels-alone runs done ($O/attention.done): one thing on the GPU at a time
  [ -e /tmp/m.gguf ] || stage synth 300 python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m
  python3 bench/h200/beam_cache.py import "$1"
  while [ ! -e "$O/attention.done" ]; do sleep 2; done
}

[ "$1" = none ] && return 0     # sourced for its functions (models/quick.sh)
case $1 in
  chunk)
    mkdir -p $M/chunks && cp ".carry/models.$2" $M/chunks/ && ls -la $M/chunks ;;
  start)
    mkdir -p "$O" $M
    if [ ! -e "$SMOL" ]; then
      cat $M/chunks/models.* .carry/models.5 > $M/both && rm -rf $M/chunks
      head -c $GEMMA_BYTES $M/both > "$GEMMA" && tail -c +$((GEMMA_BYTES + 1)) $M/both > "$SMOL" && rm $M/both
    fi
    printf '%s  %s\n%s  %s\n' $GEMMA_SHA "$GEMMA" $SMOL_SHA "$SMOL" | sha256sum -c || exit 1
    rm -rf /tmp/repo && cp -r . /tmp/repo && rm -f /tmp/repo/.carry/models.*
    touch "$RUN/last_pack"
    (cd /tmp/repo && setsid nohup bash "$H/models.sh" run > "$O/run.log" 2>&1 < /dev/null &)
    echo "started: $O/run.log" ;;
  run)
    export PYTHONPATH=${SITE:-/tmp/site}:$PWD:$PWD/.llama CACHEDB=/tmp/tinygrad_cache.db
    # 1. tinygrad's tokens while llama.cpp builds on every core (nothing is timed beside the build)
    DEV=CUDA stage reference_check 900 python3 bench/reference_check.py "${CHECK_FAMILIES[@]}" \
      --out "$O/reference_check_h200.json" "$GEMMA" "$SMOL"
    while [ ! -e /tmp/llama-build.done ]; do
      if ! pgrep -f "cmake --build /tmp/lb" > /dev/null; then tail -20 /tmp/llama-build.log; break; fi
      sleep 5
    done
    echo "llama.cpp built: $(date +%T)" | tee -a "$O/stages.txt"
    stage reference_tokens 300 python3 bench/reference_tokens.py --gpu-layers -1 \
      --out "$O/reference_tokens_h200.json" "$GEMMA:512" "$SMOL:512"
    for model in "$SMOL" "$GEMMA"; do
      name=$(basename "$model" .gguf | cut -d- -f1-2)
      profile "$name.llama" "$model" --context 512 --engine llama.cpp
      profile "$name.default" "$model" --context 512 --reference
      profile "$name.families" "$model" --context 512 --reference "${FAMILIES[@]}"
    done
    # 2. the 8B shape at 512: the best recorded route with its BEAM choices, the default, llama.cpp
    python3 "$H/beam_cache.py" import "$H/rotary_beam_cache.json"
    for depth in 512 4096; do
      profile "8b.$depth.llama" $EIGHT_B --context $depth --engine llama.cpp
      profile "8b.$depth.default" $EIGHT_B --context $depth
      profile "8b.$depth.route" $EIGHT_B --context $depth --route "$H/rotary_route.json"
      if [ $depth = 512 ]; then     # 3. tune on SmolLM2, between the depths
        stage tune_smol 420 python3 -m boltbeam tune "$SMOL" --device CUDA --target ${TARGET:-h200} --out "$RUN/tune_smol" \
          --ledger "$RUN/ledger.sqlite" --context 512 --tokens 16 --budget 1 --minutes 5 --json
        cp "$RUN/tune_smol/route.json" "$O/tune_smol_route.json" && cp "$RUN/tune_smol/report.html" "$O/tune_smol.html"
        profile "SmolLM2-135M.tuned" "$SMOL" --context 512 --reference --route "$RUN/tune_smol/route.json"
      fi
    done
    stage tune_gemma 420 python3 -m boltbeam tune "$GEMMA" --device CUDA --target ${TARGET:-h200} --out "$RUN/tune_gemma" \
      --ledger "$RUN/ledger.sqlite" --context 512 --tokens 16 --budget 1 --minutes 5 --json
    cp "$RUN/tune_gemma/route.json" "$O/tune_gemma_route.json" && cp "$RUN/tune_gemma/report.html" "$O/tune_gemma.html"
    profile "gemma-3.tuned" "$GEMMA" --context 512 --reference --route "$RUN/tune_gemma/route.json"
    touch "$O/run.done" ;;
  wait)
    end=$(( $(date +%s) + $2 ))
    while [ ! -e "$O/run.done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    [ -e "$O/run.done" ] && echo "run done" || echo "run still running"
    cat "$O/stages.txt" 2>/dev/null; tail -5 "$O/run.log"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > "$O/nvidia-smi.csv"
    # what is new since the last pack, in parts of at most ~14 MB (a file back from a call is 16 MiB at most)
    touch "$RUN/this_pack"
    (cd "$O" && find . -type f -newer "$RUN/last_pack" ! -newer "$RUN/this_pack" | sort) > "$RUN/new.txt"
    mv "$RUN/this_pack" "$RUN/last_pack"
    part=0 size=0 stamp=$(date +%H%M%S)
    : > "$RUN/part0.txt"
    while read -r f; do
      s=$(stat -c %s "$O/$f")
      if [ $size -gt 0 ] && [ $(( size + s )) -gt 14000000 ]; then part=$((part + 1)) size=0; : > "$RUN/part$part.txt"; fi
      echo "$f" >> "$RUN/part$part.txt"; size=$(( size + s ))
    done < "$RUN/new.txt"
    for p in $(seq 0 $part); do
      [ -s "$RUN/part$p.txt" ] && tar czf "$OUT/run-$stamp-$p.tgz" -C "$O" -T "$RUN/part$p.txt"
    done
    ls -la "$OUT" ;;
esac
