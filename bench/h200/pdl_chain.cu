// A yardstick, not a route: what one kernel boundary costs in a CUDA graph on this chip, and how much of it
// programmatic dependent launch (PDL) hides. llama.cpp's H200 trace overlaps every one of its 689 kernel
// boundaries a token (median 1.4 us, 1.28 ms in all); tinygrad's graphs overlap none.
//
// A chain of N dependent kernels (each reads the buffer the one before wrote) captured into one graph, launched
// plain, with the PDL attribute (each kernel waits for its predecessor at its start: griddepcontrol.wait), and
// with PDL plus an early trigger (each kernel lets its successor launch at its own start). Kernel sizes: a tiny
// one (16 KB read, like a norm's or a residual's) and a 16 MB one (like a narrow gemv's bytes).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/pdl_chain bench/h200/pdl_chain.cu && /tmp/pdl_chain > pdl_chain.json
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void step(const float *in, float *out, int n, int trigger) {
  if (trigger) asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");      // a no-op where the launch had no programmatic edge
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] * 1.0001f + 1.0f;
}

int main() {
  const int kernels = 512, reps = 30;
  const int sizes[] = {4096, 4 << 20};                  // floats: 16 KB and 16 MB
  const char *modes[] = {"plain", "pdl", "pdl_trigger"};
  cudaStream_t s; CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b; CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
  printf("{\"kernels_a_graph\": %d, \"reps\": %d, \"runs\": [\n", kernels, reps);
  bool first = true;
  for (int n : sizes) {
    float *x, *y; CHECK(cudaMalloc(&x, n * 4)); CHECK(cudaMalloc(&y, n * 4)); CHECK(cudaMemset(x, 0, n * 4));
    int threads = 256, blocks = std::min((n + threads - 1) / threads, 132 * 8);
    for (int mode = 0; mode < 3; mode++) {
      cudaGraph_t g; cudaGraphExec_t ge;
      CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int k = 0; k < kernels; k++) {
        cudaLaunchConfig_t cfg = {}; cudaLaunchAttribute attr[1];
        cfg.gridDim = blocks; cfg.blockDim = threads; cfg.stream = s;
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr; cfg.numAttrs = mode > 0 ? 1 : 0;
        const float *in = k % 2 ? y : x; float *out = k % 2 ? x : y;
        CHECK(cudaLaunchKernelEx(&cfg, step, in, out, n, mode == 2 ? 1 : 0));
      }
      CHECK(cudaStreamEndCapture(s, &g)); CHECK(cudaGraphInstantiate(&ge, g, 0));
      // one run from zeros: every mode must end on the same value (the chain's dependencies held)
      CHECK(cudaMemsetAsync(x, 0, n * 4, s)); CHECK(cudaMemsetAsync(y, 0, n * 4, s));
      CHECK(cudaGraphLaunch(ge, s)); CHECK(cudaStreamSynchronize(s));
      float last[2]; CHECK(cudaMemcpy(&last[0], x, 4, cudaMemcpyDeviceToHost)); CHECK(cudaMemcpy(&last[1], x + n - 1, 4, cudaMemcpyDeviceToHost));
      std::vector<float> us;
      for (int r = 0; r < reps; r++) {
        CHECK(cudaEventRecord(a, s)); CHECK(cudaGraphLaunch(ge, s)); CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b)); float ms; CHECK(cudaEventElapsedTime(&ms, a, b)); us.push_back(ms * 1000.0f / kernels);
      }
      std::vector<float> sorted = us; std::sort(sorted.begin(), sorted.end());
      printf("%s  {\"floats\": %d, \"bytes_read\": %d, \"blocks\": %d, \"mode\": \"%s\", \"first_and_last_value\": [%.6f, %.6f], \"median_us_a_kernel\": %.4f, \"samples_us_a_kernel\": [",
             first ? "" : ",\n", n, n * 4, blocks, modes[mode], last[0], last[1], sorted[reps / 2]);
      for (int r = 0; r < reps; r++) printf("%s%.4f", r ? ", " : "", us[r]);
      printf("]}");
      first = false;
      CHECK(cudaGraphExecDestroy(ge)); CHECK(cudaGraphDestroy(g));
    }
    CHECK(cudaFree(x)); CHECK(cudaFree(y));
  }
  printf("\n]}\n");
  return 0;
}
