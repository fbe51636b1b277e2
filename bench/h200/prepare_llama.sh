# Prepare .llama/ (ignored by git; carried to the device with `carry: [".whl", ".llama"]`) from the
# llama-cpp-python 0.3.36 sdist: its vendored llama.cpp without docs, models, tests, tools, examples and
# the back ends other than CPU and CUDA (22 MB, under the 64 MiB a device call carries), and its Python
# package. setup.sh builds the shared libraries there. Run from the repository root.
set -euo pipefail
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --no-binary :all: -d "$tmp" llama-cpp-python==0.3.36
python3 -m pip download -q --no-deps -d .whl diskcache==5.6.3 typing_extensions==4.16.0   # the binding imports them
tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
src=$tmp/llama_cpp_python-0.3.36
rm -rf .llama && mkdir -p .llama/llama.cpp
cp -r "$src"/vendor/llama.cpp/{CMakeLists.txt,cmake,ggml,include,src,vendor,licenses,LICENSE} .llama/llama.cpp/
for b in vulkan sycl opencl cann musa hip metal webgpu zdnn kompute openvino hexagon virtgpu zendnn; do
  rm -rf .llama/llama.cpp/ggml/src/ggml-$b
done
cp -r "$src"/llama_cpp .llama/ && rm -rf .llama/llama_cpp/server
rm -rf "$tmp"
du -sh .llama
