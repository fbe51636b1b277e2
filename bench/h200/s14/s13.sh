#!/usr/bin/env bash
# NOT RUN: no device machine could be started in the thirteenth session (eleven tries, 10:31-13:00 UTC). Kept here as
# the next session's plan; it reads its helpers from .carry/device (cupti_switch.py, setup.sh: copies of bench/h200/).
# Device session of 2026-12-05 (thirteenth): CUPTI switch orders, then `tune` on SmolLM2 at 512 (issues 32, 34), its
# route profiled beside llama.cpp and the default, llama.cpp timed per launch once more, then depth 4096 accounts
# (issue 35) as time allows.
# Code: `git archive HEAD` (less bench/h200) carried as .carry/src.tar, unpacked in /tmp/repo (the working tree
# here holds another engineer's edits in progress); every step runs there.
#   call 1: bash .carry/device/s13.sh unpack && cd /tmp/repo && source .carry/device/setup.sh && bash .carry/device/s13.sh first
#           (carry .whl .llama.tar.xz .carry/device .carry/src.tar .carry/models.0)
#   call 2: bash .carry/device/s13.sh start        (carry .carry/device .carry/models.1)
#   then:   cd /tmp/repo && bash .carry/device/s13.sh wait S
set -u
# stage, profile and the model paths (SMOL, SMOL_SHA, EIGHT_B; RUN, O, M) as models.sh defines them
source .carry/device/models.sh none
case $1 in
  unpack)
    rm -rf /tmp/repo && mkdir -p /tmp/repo/.carry $O $M/chunks && tar xf .carry/src.tar -C /tmp/repo &&
      cp -r .whl .llama.tar.xz /tmp/repo/ && cp -r .carry/device /tmp/repo/.carry/ && cp .carry/models.0 $M/chunks/ ;;
  first)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/nvidia-smi.csv
    python3 -c "import cupti, tinygrad; print('cupti', getattr(cupti,'__version__','?'))"
    timeout 400 python3 .carry/device/cupti_switch.py | tee $OUT/cupti_switch.jsonl ;;
  start)
    cat $M/chunks/models.0 .carry/models.1 > "$SMOL" && rm -rf $M/chunks
    echo "$SMOL_SHA  $SMOL" | sha256sum -c || exit 1
    touch $RUN/last_pack
    (cd /tmp/repo && setsid nohup bash .carry/device/s13.sh run > $O/run.log 2>&1 < /dev/null &)
    echo started ;;
  run)
    export PYTHONPATH=/tmp/site:$PWD:$PWD/.llama CACHEDB=/tmp/tinygrad_cache.db LLAMA_CPP_LIB_PATH=/tmp/lb/bin LD_LIBRARY_PATH=/tmp/lb/bin
    # tinygrad alone while llama.cpp builds on every core: tune judges relative tokens, both sides under the build
    stage tune_smol 600 python3 -m boltbeam tune "$SMOL" --device CUDA --target h200 --out "$RUN/tune_smol" \
      --ledger "$RUN/ledger.sqlite" --context 512 --tokens 16 --minutes 5 --json
    for f in route.json tune.json report.html; do cp "$RUN/tune_smol/$f" "$O/tune_smol_$f"; done
    while [ ! -e /tmp/llama-build.done ]; do
      pgrep -f "cmake --build /tmp/lb" > /dev/null || { tail -20 /tmp/llama-build.log; break; }
      sleep 5
    done
    echo "llama.cpp built: $(date +%T)" | tee -a $O/stages.txt
    profile smol.llama "$SMOL" --context 512 --engine llama.cpp
    profile smol.tuned "$SMOL" --context 512 --reference --route "$RUN/tune_smol/route.json"
    profile smol.default "$SMOL" --context 512
    BOLTBEAM_CUPTI_PER_LAUNCH=1 profile smol.llama.per_launch "$SMOL" --context 512 --engine llama.cpp
    profile 8b.4096.llama $EIGHT_B --context 4096 --engine llama.cpp
    profile 8b.4096.default $EIGHT_B --context 4096
    touch $O/run.done ;;
  wait)
    end=$(( $(date +%s) + $2 ))
    while [ ! -e $O/run.done ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    [ -e $O/run.done ] && echo "run done" || echo "run still running"
    cat $O/stages.txt 2>/dev/null; tail -5 $O/run.log
    touch $RUN/this_pack
    (cd $O && find . -type f -newer $RUN/last_pack ! -newer $RUN/this_pack | sort) > $RUN/new.txt
    mv $RUN/this_pack $RUN/last_pack
    [ -s $RUN/new.txt ] && tar czf "$OUT/run-$(date +%H%M%S).tgz" -C $O -T $RUN/new.txt
    ls -la "$OUT" ;;
esac
