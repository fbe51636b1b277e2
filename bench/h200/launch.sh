# The H200's launch and synchronization cost (and bandwidth) through tinygrad, after `source bench/h200/setup.sh`.
set -euo pipefail
python3 -m boltbeam measure-target --launch --name h200-launch --size-mb 1024 --reps 10 \
  --out "$OUT/measure_target_launch.json" > "$OUT/h200_launch.toml"
cat "$OUT/h200_launch.toml"
