#!/usr/bin/env bash
# Device session of 2026-12-05 (fourteenth), second machine of the day: the depth-4096 accounts of the 8B shape
# (issue 35: tinygrad's default, the recorded rotary route with its BEAM choices, llama.cpp), then `tune` on
# SmolLM2 with the programs kept on disk (measure/programs.py: how many profiles 5 minutes now buys; 4 before).
# Floors on the target the GPU is (h100-sxm or h200). Code: git archive HEAD carried as .carry/src.tar.
#   call 1: bash .carry/device/s14.sh unpack && cd /tmp/repo && source .carry/device/setup.sh && bash .carry/device/s14.sh start
#           (carry .whl .llama.tar.xz .carry/device .carry/src.tar .carry/models.0)
#   call 2: bash .carry/device/s14.sh join      (carry .carry/device .carry/models.1)
#   then:   cd /tmp/repo && bash .carry/device/s14.sh wait S
set -u
source .carry/device/models.sh none
case $(nvidia-smi --query-gpu=name --format=csv,noheader) in *H100*) TARGET=h100-sxm ;; *) TARGET=h200 ;; esac
prof() {   # prof NAME MODEL FLAGS...: the trace (gzipped) and its account on this GPU's target
  local name=$1 model=$2
  shift 2
  stage "$name" 400 python3 -m boltbeam profile "$model" --device CUDA --tokens 16 --no-hash "$@" \
    --out "$RUN/$name.trace.json" --json
  [ -e "$RUN/$name.trace.json" ] || return
  gzip -c "$RUN/$name.trace.json" > "$O/$name.json.gz"
  stage "$name.account" 120 python3 -m boltbeam account "$RUN/$name.trace.json" --model "$model" --no-hash-check \
    --target $TARGET --json
}
case $1 in
  unpack)
    rm -rf /tmp/repo && mkdir -p /tmp/repo/.carry $O $M/chunks && tar xf .carry/src.tar -C /tmp/repo &&
      cp -r .whl .llama.tar.xz /tmp/repo/ && cp -r .carry/device /tmp/repo/.carry/ && cp .carry/models.0 $M/chunks/ ;;
  start)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/nvidia-smi.csv
    touch $RUN/last_pack
    (cd /tmp/repo && setsid nohup bash .carry/device/s14.sh run > $O/run.log 2>&1 < /dev/null &)
    echo "started, target $TARGET" ;;
  join)
    cat $M/chunks/models.0 .carry/models.1 > "$SMOL.part" && mv "$SMOL.part" "$SMOL" && rm -rf $M/chunks
    echo "$SMOL_SHA  $SMOL" | sha256sum -c ;;
  run)
    export PYTHONPATH=/tmp/site:$PWD:$PWD/.llama CACHEDB=/tmp/tinygrad_cache.db LLAMA_CPP_LIB_PATH=/tmp/lb/bin LD_LIBRARY_PATH=/tmp/lb/bin
    prof 8b.4096.default $EIGHT_B --context 4096
    python3 .carry/device/beam_cache.py import .carry/device/rotary_beam_cache.json
    prof 8b.4096.route $EIGHT_B --context 4096 --route .carry/device/rotary_route.json
    while [ ! -e /tmp/llama-build.done ]; do
      pgrep -f "cmake --build /tmp/lb" > /dev/null || { tail -20 /tmp/llama-build.log; break; }
      sleep 5
    done
    echo "llama.cpp built: $(date +%T)" | tee -a $O/stages.txt
    prof 8b.4096.llama $EIGHT_B --context 4096 --engine llama.cpp
    while [ ! -e "$SMOL" ]; do sleep 2; done
    stage tune_smol 420 python3 -m boltbeam tune "$SMOL" --device CUDA --target $TARGET --out "$RUN/tune_smol" \
      --ledger "$RUN/ledger.sqlite" --context 512 --tokens 16 --budget 1 --minutes 5 --json
    for f in route.json tune.json; do cp "$RUN/tune_smol/$f" "$O/tune_smol_$f"; done
    prof smol.llama "$SMOL" --context 512 --engine llama.cpp
    touch $O/run.done ;;
  wait)
    bash .carry/device/s13.sh wait "$2" ;;
esac
