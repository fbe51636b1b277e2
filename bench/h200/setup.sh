# Sourced at the start of every device call: the carried wheels, the repo on the path, and the
# llama.cpp build started in the background (it outlives the call while the machine stays warm).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
# llama.cpp's shared libraries for its Python binding (.llama/llama_cpp, from the llama-cpp-python 0.3.36
# sdist; .llama/llama.cpp is its vendored source without docs, models, tests, tools and examples).
# (carried as .llama.tar.xz where the working tree leaves too little of a call's 64 MiB for the folder)
[ -e .llama.tar.xz ] && [ ! -d .llama ] && tar xJf .llama.tar.xz
export LLAMA_CPP_LIB_PATH=/tmp/lb/bin LD_LIBRARY_PATH=/tmp/lb/bin:${LD_LIBRARY_PATH:-}
[ -d .llama/llama_cpp ] && export PYTHONPATH=$PYTHONPATH:$PWD/.llama
if [ ! -e /tmp/llama-build.started ] && [ -d .llama/llama.cpp ]; then
  touch /tmp/llama-build.started
  # Build from a copy: each device call re-copies the working tree, which would pull sources from
  # under a background build of .llama/ itself.
  cp -r .llama/llama.cpp /tmp/llama-src
  setsid nohup bash -c "cd /tmp/llama-src && cmake -B /tmp/lb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_COMMIT=0c1e57098 -DLLAMA_BUILD_NUMBER=0 \
    && cmake --build /tmp/lb -j16 --target llama && touch /tmp/llama-build.done" > /tmp/llama-build.log 2>&1 &
fi
[ -e /tmp/m.gguf ] || python3 -m boltbeam synth /tmp/m.gguf --arch qwen3 --preset 8b --mix q4_k_m || exit 1
