# Wait (up to $1 seconds) for the background llama.cpp build, then run llama-bench at depth 0 and 512.
# (Since the llama.cpp kernel-by-kernel audit, setup.sh builds llama.cpp's shared libraries for its Python
# binding, not llama-bench: add -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON and --target llama-bench
# to its cmake lines to run this again. `boltbeam profile --engine llama.cpp` records the same wall.)
for i in $(seq "${1:-300}"); do [ -e /tmp/llama-build.done ] && break; sleep 1; done
if [ -e /tmp/llama-build.done ]; then
  /tmp/lb/bin/llama-bench -m /tmp/m.gguf -p 0 -n 128 -d 0,512 -fa 1 -r 3 -o json > "$OUT/llama_bench.json" 2> "$OUT/llama_bench.err"
  echo "llama-bench rc=$?"
else
  echo "llama.cpp build not finished"; tail -5 /tmp/llama-build.log
fi
