#!/usr/bin/env bash
# The generated decode-attention forms alone at depth (issue 31): each form's kernels for 36 layers in one
# graph (bench/h200/attention_kernels.py), at depths 540, 4096 and 16383 of a 16,384-position cache, the
# 8B shape (8 key heads of 4 query heads, 128 dimensions); then Nsight Compute on each kernel at 4096.
#   DEV=CUDA [NCU_EXTRA="--section ..."] bash bench/h200/s15/attention.sh OUT "FORMS" ["NCU_FORMS"]     (after the wheels)
set -u
OUT=$1 FORMS=$2 NCU_FORMS=${3:-$2}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv"
for depth in 540 4096 16383; do
  FORMS="$FORMS" timeout 200 python3 bench/h200/attention_kernels.py "$OUT/attention_$depth.json" 8 4 128 16384 $depth 36 50 \
    2>&1 | tail -20
done
for form in $NCU_FORMS; do     # each kernel's own time, first launch after capture, at depth 4096
  FORMS=$form timeout 120 ncu --csv --clock-control none -k regex:attention_ -c 4 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats ${NCU_EXTRA:-} \
    python3 bench/h200/attention_kernels.py /tmp/ncu.json 8 4 128 16384 4096 1 1 > "/tmp/ncu_${form//:/_}.csv" 2>&1
done
cat /tmp/ncu_*.csv > "$OUT/ncu_4096.csv"
