# Sourced at the start of every device call: the carried wheels, the repo on the path, and the
# llama.cpp build started in the background (it outlives the call while the machine stays warm).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
if [ ! -e /tmp/llama-build.started ] && [ -d .llama/llama.cpp ]; then
  touch /tmp/llama-build.started
  # Build from a copy: each device call re-copies the working tree, which would pull sources from
  # under a background build of .llama/ itself.
  cp -r .llama/llama.cpp /tmp/llama-src
  setsid nohup bash -c "cd /tmp/llama-src && cmake -B /tmp/lb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_COMMIT=0c1e57098 -DLLAMA_BUILD_NUMBER=0 \
    && cmake --build /tmp/lb -j12 --target llama-bench && touch /tmp/llama-build.done" > /tmp/llama-build.log 2>&1 &
fi
[ -e /tmp/m.gguf ] || python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m || exit 1
