# What calls 14-15 ran (README.md), as run: `models.sh`'s stage/profile functions (sourced; models.sh was
# patched there to return before its `case` when given `none`), with tokens timed per launch switched off in
# every Python process by /tmp/patch/sitecustomize.py:
#   from boltbeam.measure import graph_timing as g
#   g.Cupti.per_launch = lambda self: "per launch off: CUPTI graph records after kernel records crash cuGraphLaunch on this driver (2026-12-05)"
# (154b571 then made that the default.) Started with `setsid nohup bash /tmp/quick.sh`.
source .carry/device/models.sh none
export PYTHONPATH=/tmp/patch:/tmp/site:$PWD:$PWD/.llama CACHEDB=/tmp/tinygrad_cache.db LLAMA_CPP_LIB_PATH=/tmp/lb/bin LD_LIBRARY_PATH=/tmp/lb/bin
rm -f $O/run.done
S=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf G=/tmp/models/gemma-3-270m-q4_k_m.gguf
profile SmolLM2-135M.default $S --context 512
profile SmolLM2-135M.families $S --context 512 "${FAMILIES[@]}"
profile SmolLM2-135M.llama $S --context 512 --engine llama.cpp
profile 8b.512.default /tmp/m.gguf --context 512
profile 8b.512.route /tmp/m.gguf --context 512 --route .carry/device/rotary_route.json
profile 8b.512.llama /tmp/m.gguf --context 512 --engine llama.cpp
profile gemma-3.default $G --context 512
profile gemma-3.llama $G --context 512 --engine llama.cpp
touch $O/run.done
