"""Importers: other engines' measurements in, BoltBeam's one normalized trace out.

- llama-bench JSON: whole-token walls per repetition, no kernels.
- Chrome trace JSON (torch.profiler / Kineto): kernels, tokens from annotations or a count.
- Nsight Systems cuda_gpu_trace CSV: kernels and copies, tokens from a count.

Each returns a validated Trace; writing it is the caller's (`trace.save`), so a refused file
leaves nothing behind.
"""
from boltbeam.measure.importers.chrome_trace import import_chrome_trace
from boltbeam.measure.importers.common import DEFAULT_TOKEN_MARKER
from boltbeam.measure.importers.llama_bench import import_llama_bench
from boltbeam.measure.importers.nsys import import_nsys_gpu_trace

__all__ = ["DEFAULT_TOKEN_MARKER", "import_chrome_trace", "import_llama_bench", "import_nsys_gpu_trace"]
