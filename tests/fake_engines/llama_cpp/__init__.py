"""A stand-in for llama-cpp-python's low-level API (the calls boltbeam.measure.llama_cpp_child makes)."""
import ctypes
import os
import time
from types import SimpleNamespace

__version__ = "0.0-fake"
LLAMA_LOAD_MODE_MMAP = 1
LLAMA_FLASH_ATTN_TYPE_ENABLED = 1
llama_token = ctypes.c_int32
RECORDS = []          # what the fake CUPTI reports: one (name, grid, block, graph, start, end) per kernel
_state = {}


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


def llama_decode(ctx, n):
    t = time.perf_counter_ns()
    for g in _state["grids"]:
        RECORDS.append(("rms_norm_f32", [1, 1, 1], [1024, 1, 1], 7, t, t + 1000))
        RECORDS.append(("mul_mat_vec_q", [g, 1, 1], [32, 4, 1], 7, t + 1000, t + 3000))
        t += 3000
    while time.perf_counter_ns() < t:   # the kernels "run" within the call, as a synchronizing decode's do
        pass
    return 0


def llama_get_logits_ith(ctx, i):
    _state["logits"] = (ctx_array := (ctypes.c_float * _state["vocab"])())
    ctx_array[3] = 1.0
    return ctx_array
