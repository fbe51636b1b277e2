# The routes the one- and two-worker searches chose (bench/h200/fanout.sh), written again from their
# ledgers (every timing reused: nothing is timed), then both whole tokens on one GPU and the judge:
# is the route chosen with two GPUs the one chosen with one? After `source bench/h200/setup.sh`:
#   RUN=bench/h200/fanout/run1 bash bench/h200/fanout_judge.sh
set -euo pipefail
for n in 1 2; do
  cp "$RUN/ledger_w$n.sqlite" "/tmp/again_w$n.sqlite"
  CUDA_VISIBLE_DEVICES=$((n - 1)) python3 -m boltbeam search /tmp/m.gguf --device CUDA --target h200 --context 512 \
    --budget 16 --seconds-per-kernel 60 --no-judge --ledger "/tmp/again_w$n.sqlite" --out "$OUT/w$n" --json \
    > "$OUT/again_w$n.json" &
done
wait
rm -f "$OUT"/w?/search.json
for n in 1 2; do
  CUDA_VISIBLE_DEVICES=0 python3 -m boltbeam profile /tmp/m.gguf --device CUDA --context 512 --tokens 16 \
    --route "$OUT/w$n/route.json" --out "$OUT/profile_w$n.json" --json > /dev/null
done
python3 -m boltbeam judge --baseline "$OUT/profile_w1.json" --candidate "$OUT/profile_w2.json" --json \
  > "$OUT/judge_w2_vs_w1.json" || true
python3 -c "import json; j = json.load(open('$OUT/judge_w2_vs_w1.json')); print(j['verdict']); print(*j['reasons'], sep='\n')"
