"""The llama.cpp decode itself, in a process of its own: `python -m boltbeam.measure.llama_cpp_child`.

Why a process: on the H200, llama.cpp's CUDA model load crashed (segmentation fault) in any process
that had imported the `gguf` Python package first (BoltBeam's reader), and earlier in one that had
imported `cupti` first. This process loads the model before it imports either, and imports nothing of
BoltBeam's that reads a model.

Reads a `Request` as JSON on stdin; writes progress lines ("tick STAGE") to stderr and the `RawRun` as
JSON to the request's `out` file; a bad request or a failed load is one line on stderr and exit 2 (BadInput) or 3 (Refused).
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass

from boltbeam.errors import BadInput, Refused


@dataclass
class Request:
    """What the parent asks: the model, the positions to allocate, the prompt, the tokens to decode."""
    model: str
    n_ctx: int
    prompt: list[int]
    tokens: int
    warmup: int
    out: str            # where the RawRun goes
    timed: bool = True  # False: the greedy tokens alone, `tokens` steps after the prefill, nothing timed (a reference)


@dataclass
class RawRun:
    """What the child measured, before any interpretation. Timed tokens alternate: one timed per kernel, then
    one timed per launch; marks on CUPTI's clock before each `lc.llama_decode` and after its token is read back."""
    walls_us: list[float]               # plain tokens
    timed_walls_us: list[float]         # tokens timed per kernel
    marks_ns: list[tuple[int, int]]     # per timed token (each kind, in the order they ran), CUPTI's clock
    output_tokens: list[int]
    binding: str                        # llama-cpp-python's version
    cupti_python: str
    records: list[tuple[str, list[int], list[int], int, int, int]]   # name, grid, block, graph id, start, end (ns)
    launch_walls_us: list[float]        # tokens timed per launch
    graphs: list[tuple[int, int, int, int]]    # graph id, launch correlation, start, end (ns)
    calls: list[tuple[int, int]]        # graph-launch calls: correlation, start (ns)
    notes: list[str]

    def cupti_records(self):
        from boltbeam.measure.graph_timing import GraphRecord, KernelRecord, LaunchCall, LaunchFacts, Records
        return Records([KernelRecord(LaunchFacts(name, tuple(grid), tuple(block)), graph, start, end)
                        for name, grid, block, graph, start, end in self.records],
                       [GraphRecord(*g) for g in self.graphs], [LaunchCall(*c) for c in self.calls])


def _binding():
    """llama-cpp-python's module, its load log off; one line when it is missing or its library does not load."""
    try:
        import llama_cpp
        from llama_cpp._logger import set_verbose
    except ImportError as e:
        raise BadInput(f"profiling llama.cpp needs llama-cpp-python built with CUDA (CMAKE_ARGS=-DGGML_CUDA=on "
                       f"pip install llama-cpp-python): {e}") from None
    except (OSError, RuntimeError) as e:   # its ctypes loader found no library, or one that does not load
        raise BadInput(f"llama-cpp-python's library does not load here: {e}") from None
    set_verbose(False)
    return llama_cpp


class _Engine:
    """A model and one context on it, every layer on the GPU, flash attention on."""
    def __init__(self, lc, path: str, n_ctx: int):
        self.lc = lc
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = -1
        mp.load_mode = lc.LLAMA_LOAD_MODE_MMAP    # as the binding's own high-level class loads
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise BadInput(f"llama.cpp cannot load {path}")
        if n_ctx > (trained := lc.llama_model_n_ctx_train(self.model)):
            raise BadInput(f"{n_ctx} positions (the prompt and the decoded tokens) exceed the model's context "
                           f"length {trained}")
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise Refused(f"llama.cpp could not create a context of {n_ctx} positions on {path}")
        self.vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def decode(self, tokens: list[int]) -> int:
        """Run the tokens (one batch), wait for the device, read the last logits back: the greedy next token."""
        import numpy as np
        lc = self.lc
        arr = (lc.llama_token * len(tokens))(*tokens)
        if lc.llama_decode(self.ctx, lc.llama_batch_get_one(arr, len(tokens))) != 0:
            raise Refused("llama.cpp could not decode the batch")
        lc.llama_synchronize(self.ctx)
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, -1), shape=(self.vocab,))
        return int(logits.argmax())


def _tick(stage: str) -> None:
    print(f"tick {stage}", file=sys.stderr, flush=True)


def run(req: Request) -> RawRun:
    """Prefill, warm up, plain tokens, then CUPTI on and the timed tokens, each timed per kernel and then one
    timed per launch, flushed once."""
    prompt, tokens, warmup = req.prompt, req.tokens, req.warmup
    lc = _binding()
    llm = _Engine(lc, req.model, req.n_ctx)
    if max(prompt) >= llm.vocab:
        raise BadInput(f"the prompt holds token {max(prompt)}; llama.cpp's vocabulary has {llm.vocab}")
    if req.timed:
        from boltbeam.measure.graph_timing import Cupti    # imports cupti in start(), after the load
        cupti = Cupti()
    out = []
    for i in range(0, len(prompt), 512):
        nxt = llm.decode(prompt[i:i + 512])
    out.append(nxt)
    _tick("prefill")

    def step(clock=time.perf_counter_ns) -> tuple[int, int]:
        """One token: the clock before `lc.llama_decode` and after the token is read back."""
        before = clock()
        out.append(llm.decode([out[-1]]))
        return before, clock()

    if not req.timed:
        for _ in range(tokens):
            step()
            _tick("reference")
        return RawRun([], [], [], out, lc.__version__, "", [], [], [], [], [])
    for _ in range(warmup):
        step()
        _tick("warm-up")
    walls = []
    for _ in range(tokens):
        before, after = step()
        walls.append((after - before) / 1e3)
        _tick("plain")
    cupti.start()
    marks, timed_walls, launch_walls, notes = [], [], [], []
    for _ in range(tokens):
        cupti.per_kernel()
        marks.append(step(cupti.now_ns))
        timed_walls.append((marks[-1][1] - marks[-1][0]) / 1e3)
        _tick("timed")
        if notes or (said := cupti.per_launch()):
            notes = notes or [said]
            continue
        marks.append(step(cupti.now_ns))
        launch_walls.append((marks[-1][1] - marks[-1][0]) / 1e3)
        _tick("timed per launch")
    records = cupti.stop()
    from importlib.metadata import version
    return RawRun(walls, timed_walls, marks, out, lc.__version__, version("cupti-python"),
                  [(r.facts.name, list(r.facts.grid), list(r.facts.block), r.graph_id, r.start_ns, r.end_ns)
                   for r in records.kernels], launch_walls,
                  [(g.graph_id, g.correlation, g.start_ns, g.end_ns) for g in records.graphs],
                  [(c.correlation, c.start_ns) for c in records.calls], notes)


def main() -> int:
    try:
        req = Request(**json.load(sys.stdin))
        result = run(req)
        with open(req.out, "w") as f:   # a file, not stdout: the parent reads stderr until this process ends
            json.dump(asdict(result), f)
    except BadInput as e:
        print(e, file=sys.stderr)
        return 2
    except Refused as e:
        print(e, file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
