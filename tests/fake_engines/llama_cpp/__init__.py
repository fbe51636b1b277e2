"""A stand-in for llama-cpp-python's low-level API (the calls boltbeam.measure.llama_cpp_child makes)."""
import ctypes
import os
import time
from types import SimpleNamespace

__version__ = "0.0-fake"
LLAMA_LOAD_MODE_MMAP = 1
LLAMA_FLASH_ATTN_TYPE_ENABLED = 1
llama_token = ctypes.c_int32
# What the fake CUPTI reports, of the kinds it has enabled (ACTIVE): one (name, grid, block, graph, start, end) a
# kernel, one (graph, correlation, start, end) a graph, one (correlation, start) a graph-launch call
RECORDS, GRAPHS, CALLS, ACTIVE = [], [], [], set()
# A decode step's times, as on a GPU (µs): the host's work before it launches its one graph, the launch to the first
# kernel, each kernel; what recording kernels costs each kernel on the device, and the host at the launch
HOST_US, LATENCY_US, KERNEL_US = 1500, 400, 30
KERNEL_COST_US, CUPTI_HOST_US = 2, 30000   # CUPTI's host cost far above a preempted spin's overshoot on a loaded machine
_state = {"calls": 0}


def llama_backend_init():
    pass


def llama_model_default_params():
    return SimpleNamespace(n_gpu_layers=0, load_mode=0)


def llama_context_default_params():
    return SimpleNamespace(n_ctx=0, n_batch=0, n_ubatch=0, flash_attn_type=0, no_perf=False)


def llama_model_load_from_file(path, params):
    if os.environ.get("FAKE_LLAMA_LOAD") == "fail":
        return None
    from boltbeam.measure.llama_cpp_roles import products_in_order
    from boltbeam.read.census import take_census
    census = take_census(path.decode())
    tables = products_in_order(census)
    grids, i = [], 0
    while i < len(tables):    # gate and up of one block as one kernel, as llama.cpp fuses them
        fused = i + 1 < len(tables) and (tables[i].role, tables[i + 1].role) == ("ffn_gate", "ffn_up")
        grids.append(tables[i].shape[1])
        i += 2 if fused else 1
    _state.update(grids=grids, vocab=census.facts.vocabulary, ctx_train=census.facts.context_length or 4096)
    return "model"


def llama_model_n_ctx_train(model):
    return _state["ctx_train"]


def llama_init_from_model(model, params):
    return "ctx"


def llama_model_get_vocab(model):
    return "vocab"


def llama_vocab_n_tokens(vocab):
    return _state["vocab"]


def llama_batch_get_one(arr, n):
    return n


def _spin_until(t_ns):
    while time.perf_counter_ns() < t_ns:
        pass


def llama_decode(ctx, n):
    """Builds the step on the host, launches its graph and returns: the kernels run after, on the "device"."""
    per_kernel = "CONCURRENT_KERNEL" in {getattr(k, "name", k) for k in ACTIVE}
    _spin_until(time.perf_counter_ns() + 1000 * (HOST_US + (CUPTI_HOST_US if per_kernel else 0)))
    launch = time.perf_counter_ns()
    _state["calls"] += 1
    if "launch calls" in ACTIVE:
        CALLS.append((_state["calls"], launch))
    t = first = launch + 1000 * LATENCY_US
    kernel = 1000 * (KERNEL_US + (KERNEL_COST_US if per_kernel else 0))
    for g in _state["grids"]:
        if per_kernel:
            RECORDS.append(("rms_norm_f32", [1, 1, 1], [1024, 1, 1], 7, t, t + kernel // 3))
            RECORDS.append(("mul_mat_vec_q", [g, 1, 1], [32, 4, 1], 7, t + kernel // 3, t + kernel))
        t += kernel
    if "GRAPH_TRACE" in {getattr(k, "name", k) for k in ACTIVE}:
        GRAPHS.append((7, _state["calls"], first, t))
    _state["end"] = t
    return 0


def llama_synchronize(ctx):
    _spin_until(_state["end"])


def llama_get_logits_ith(ctx, i):
    _state["logits"] = (ctx_array := (ctypes.c_float * _state["vocab"])())
    ctx_array[3] = 1.0
    return ctx_array
