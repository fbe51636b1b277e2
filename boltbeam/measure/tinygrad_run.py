"""The tinygrad adapter: decode through tinygrad's own model code and write one trace.

Two passes over one loaded model:
  1. graph pass: the JIT with its graph, as users run it; the wall time of every token.
  2. kernel pass: the JIT captured again with JIT=2 (kernels launched one by one) and every kernel
     recorded: name, launch dimensions, opts, tinygrad's own estimates, the buffers it touches and
     its time on one device timeline (CUDA events around each launch, synchronized once per token;
     on other devices tinygrad's own per-kernel timing with wait=True).
Weights stay views of the GGUF file's buffer, so a view's offset is a tensor's data offset in the
file: that maps each kernel to the tensors it reads, and so to roles. A kernel that reads no weight
is classified by the buffers it touches (KV cache, rope table, logits) and by what it does.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import datetime as dt
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from boltbeam import __version__
from boltbeam.errors import BadInput, Refused
from boltbeam.files import sha256_file
from boltbeam.measure.trace import Kernel, Trace
from boltbeam.read.census import Census, TensorEntry, take_census
from boltbeam.read.roles import ROLES

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NORM_ROLES = {r for r, (kind, _) in ROLES.items() if kind == "vector"}
TIMING = {
    "graph": "CUDA event nodes before and after every kernel node of the JIT's CUDA graphs; read once per token",
    "launch": "kernels launched one by one (JIT=2), CUDA events around each launch; one synchronize per token",
    "wait": "kernels launched one by one (JIT=2), tinygrad's own per-kernel timing (wait=True): each synchronized",
}


@dataclass
class Launch:
    """One kernel launch as the hook saw it, before its time is known."""
    name: str
    op: str                      # "kernel" or "copy"
    global_size: list[int] | None
    local_size: list[int] | None
    opts: list[str] | None
    ops: int | None
    mem: int | None
    reads: list[Any]             # tinygrad Buffers
    writes: list[Any]
    host_start: float = 0.0
    duration_s: float | None = None
    events: tuple | None = None  # (start, end) CUDA events


class _CudaEvents:
    """A pool of CUDA events recorded on the launch stream around each kernel; read once per token."""
    def __init__(self):
        from tinygrad.runtime.autogen import cuda
        self.cuda, self.pool, self.used, self.pool_kept = cuda, [], 0, []

    def _event(self):
        if self.used == len(self.pool):
            ev = self.cuda.CUevent()
            self.cuda.cuEventCreate(ctypes.byref(ev), 0)
            self.pool.append(ev)
        self.used += 1
        return self.pool[self.used - 1]

    def record(self):
        ev = self._event()
        self.cuda.cuEventRecord(ev, None)
        return ev

    def kept(self):
        """An event outside the pool, for a graph node that records it on every replay."""
        ev = self.cuda.CUevent()
        self.cuda.cuEventCreate(ctypes.byref(ev), 0)
        self.pool_kept.append(ev)
        return ev

    def elapsed_s(self, a, b) -> float:
        ms = ctypes.c_float()
        self.cuda.cuEventElapsedTime(ctypes.byref(ms), a, b)
        return ms.value * 1e-3

    def reset(self):
        self.used = 0


@dataclass
class Recorder:
    device: str
    timing: str = "launch"        # "launch": around each launch; "graph": event nodes inside CUDA graphs
    active: bool = False
    instrument_graphs: bool = False
    launches: list[Launch] = field(default_factory=list)
    events: _CudaEvents | None = None
    graph_events: dict[int, list[tuple]] = field(default_factory=dict)   # graph runner -> (start, end) per kernel

    def __post_init__(self):
        if self.device.startswith("CUDA"):
            self.events = _CudaEvents()
        elif self.timing == "graph":
            raise BadInput("--timing graph needs CUDA (tinygrad's CUDA graphs); use --timing launch")

    @contextlib.contextmanager
    def install(self):
        """Wrap tinygrad's per-call stats hook (and, off CUDA, ask it to time each kernel); with graph
        timing, also put an event node before and after every kernel node of the graphs built while
        `instrument_graphs` is set."""
        from tinygrad.engine import jit, realize
        from tinygrad.uop.ops import Ops, sym_infer
        orig_track, orig_run = realize.track_stats, jit.run_linear
        rec = self

        @contextlib.contextmanager
        def track_stats(ctx, call, device, bufs, var_vals):
            ast = call.src[0]
            if rec.active and rec.timing == "graph" and ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph":
                with orig_track(ctx, call, device, bufs, var_vals) as et:
                    yield et
                rec._graph_launches(realize.get_graph_runtime(ast), var_vals, Ops, sym_infer)
                return
            if not rec.active or ast.op not in (Ops.PROGRAM, Ops.COPY):
                with orig_track(ctx, call, device, bufs, var_vals) as et:
                    yield et
                return
            launch = rec._launch(ast, bufs, var_vals, Ops, sym_infer)
            start = rec.events.record() if rec.events else None
            launch.host_start = time.perf_counter()
            with orig_track(ctx, call, device, bufs, var_vals) as et:
                yield et
            if rec.events:
                launch.events = (start, rec.events.record())
            else:
                launch.duration_s = et[0] if et[0] is not None else time.perf_counter() - launch.host_start
            rec.launches.append(launch)

        def run_linear(*args, **kwargs):
            if rec.active and rec.events is None:
                kwargs["wait"] = True   # tinygrad's own per-kernel timing: synchronize after each
            return orig_run(*args, **kwargs)

        realize.track_stats, jit.run_linear = track_stats, run_linear
        with self._graph_nodes() if self.timing == "graph" else contextlib.nullcontext():
            try:
                yield self
            finally:
                realize.track_stats, jit.run_linear = orig_track, orig_run

    @contextlib.contextmanager
    def _graph_nodes(self):
        from tinygrad.runtime.autogen import cuda
        from tinygrad.runtime.graph import cuda as cuda_graph
        from tinygrad.runtime.ops_cuda import check
        orig_add, orig_init = cuda.cuGraphAddKernelNode, cuda_graph.CUDAGraph.__init__
        rec, pending = self, []

        def add_kernel_node(node_ref, graph, deps, n_deps, params):
            if not rec.instrument_graphs:
                return orig_add(node_ref, graph, deps, n_deps, params)
            start, end = rec.events.kept(), rec.events.kept()
            start_node, end_node = cuda.CUgraphNode(), cuda.CUgraphNode()
            check(cuda.cuGraphAddEventRecordNode(ctypes.byref(start_node), graph, deps, n_deps, start))
            status = orig_add(node_ref, graph, (cuda.CUgraphNode * 1)(start_node), 1, params)
            check(status)
            check(cuda.cuGraphAddEventRecordNode(ctypes.byref(end_node), graph, (cuda.CUgraphNode * 1)(node_ref._obj), 1, end))
            pending.append((start, end))
            return status

        def init(graph_runner, *args, **kwargs):
            pending.clear()
            orig_init(graph_runner, *args, **kwargs)
            if rec.instrument_graphs:
                rec.graph_events[id(graph_runner)] = list(pending)

        cuda.cuGraphAddKernelNode, cuda_graph.CUDAGraph.__init__ = add_kernel_node, init
        try:
            yield
        finally:
            cuda.cuGraphAddKernelNode, cuda_graph.CUDAGraph.__init__ = orig_add, orig_init

    def _graph_launches(self, runner, var_vals, Ops, sym_infer) -> None:
        pairs = self.graph_events.get(id(runner))
        if pairs is None:
            raise Refused("adapter-incomplete: a CUDA graph ran that was built without BoltBeam's event nodes")
        kernels = [(ast, bufs) for _, ast, bufs, _ in runner.calls if ast.op is Ops.PROGRAM]
        for (ast, bufs), events in zip(kernels, pairs, strict=True):
            launch = self._launch(ast, bufs, var_vals, Ops, sym_infer)
            launch.events = events
            self.launches.append(launch)

    @staticmethod
    def _launch(ast, bufs, var_vals, Ops, sym_infer) -> Launch:
        if ast.op is Ops.COPY:
            return Launch(name=f"copy {bufs[0].nbytes} B", op="copy", global_size=None, local_size=None, opts=None,
                          ops=0, mem=2 * bufs[0].nbytes, reads=[bufs[1]], writes=[bufs[0]])
        info = ast.arg
        gs, ls = info.launch_dims(var_vals)
        kinfo = ast.src[0].arg
        est = kinfo.estimates
        opts = [str(o) for o in getattr(kinfo, "applied_opts", ()) or ()]
        outs, ins = set(info.outs), set(info.ins)
        return Launch(name=ANSI.sub("", info.name), op="kernel", global_size=[int(g) for g in gs],
                      local_size=None if ls is None else [int(x) for x in ls], opts=opts,
                      ops=None if est is None else int(sym_infer(est.ops, var_vals)),
                      mem=None if est is None else int(sym_infer(est.mem, var_vals)),
                      reads=[b for i, b in enumerate(bufs) if i not in outs or i in ins],
                      writes=[b for i, b in enumerate(bufs) if i in outs])

    def timeline(self) -> list[tuple[Launch, float, float]]:
        """(launch, start_s from the first launch, duration_s), after the token has synchronized."""
        if not self.launches:
            return []
        if self.events:
            first = self.launches[0].events[0]
            out = [(l, self.events.elapsed_s(first, l.events[0]), self.events.elapsed_s(*l.events)) for l in self.launches]
            t0 = min(start for _, start, _ in out)   # inside a graph, the first node submitted need not start first
            out = [(l, start - t0, dur) for l, start, dur in out]
        else:
            t0 = self.launches[0].host_start
            out = [(l, l.host_start - t0, l.duration_s or 0.0) for l in self.launches]
        self.launches = []
        if self.events:
            self.events.reset()
        return out


class Classifier:
    """Maps a launch to (category, role, tensors) from the buffers it touches, never from tensor or
    model names; only a kernel that touches nothing it can place falls back on tinygrad's kind prefix."""
    def __init__(self, census: Census, file_size: int, kv_bases: set[int], rope_bases: set[int]):
        self.tensors = sorted((t for t in census.tensors if not t.tied), key=lambda t: t.data_offset)
        self.offsets = [t.data_offset for t in self.tensors]
        self.file_size, self.kv_bases, self.rope_bases = file_size, kv_bases, rope_bases
        self.logits_bytes = {census.facts.vocabulary * n for n in (2, 4)}
        self.tied = census.tied_embeddings

    def _tensor_at(self, buf) -> TensorEntry | None:
        if buf._base is None or buf.base.nbytes != self.file_size:
            return None
        i = bisect.bisect_right(self.offsets, buf.offset) - 1
        if i >= 0 and buf.offset < self.offsets[i] + self.tensors[i].bytes:
            return self.tensors[i]
        return None

    def classify(self, l: Launch) -> tuple[str, str | None, list[str]]:
        if l.op == "copy":
            return "copy", None, []
        read = [t for b in l.reads if (t := self._tensor_at(b)) is not None]
        names = sorted({t.name for t in read})
        if read:
            weights = [t for t in read if t.role not in NORM_ROLES]
            main = max(weights or read, key=lambda t: t.bytes)
            role = main.role
            # With tied embeddings one table plays two roles: a lookup moves a row, the output
            # projection moves the whole table (tinygrad's own byte estimate tells them apart).
            if self.tied and role == "token_embd" and (l.mem or 0) >= main.bytes // 2:
                role = "output"
            return ("weights" if weights else "norm"), role, names
        bases = lambda bs: {id(b.base) for b in bs}
        if bases(l.writes) & self.kv_bases:
            return "kv_write", None, []
        if bases(l.reads) & self.kv_bases:
            return "attention", None, []
        if bases(l.reads) & self.rope_bases:
            return "rope", None, []
        if any(b.nbytes in self.logits_bytes for b in l.reads) and all(b.nbytes < 64 for b in l.writes):
            return "sampling", None, []
        # tinygrad names a kernel by its kind: E_ for elementwise, r_ for one with a reduction.
        return ("elementwise" if l.name.startswith("E_") else "other"), None, []


def _environment(device: str, model: pathlib.Path, model_hash: bool) -> dict[str, Any]:
    from importlib.metadata import version

    from tinygrad import Device
    dev = Device[device]
    env: dict[str, Any] = {
        "engine": "tinygrad", "engine_version": version("tinygrad"), "device": device,
        "host": platform.node(), "python": platform.python_version(), "platform": platform.platform(),
        "compiler": type(dev.compiler).__name__ if getattr(dev, "compiler", None) else None,
        "renderer": type(dev.renderer).__name__, "command": " ".join(sys.argv),
        "model_path": str(model), "model_sha256": sha256_file(model) if model_hash else None,
        "tool": f"boltbeam {__version__}",
    }
    if device.startswith("CUDA"):
        from tinygrad.runtime.autogen import cuda
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev.cu_device)
        ver = ctypes.c_int()
        cuda.cuDriverGetVersion(ctypes.byref(ver))
        env.update(device_name=name.value.decode(), driver=f"CUDA {ver.value // 1000}.{ver.value % 1000 // 10}",
                   arch=getattr(dev, "arch", None), compiler_version=f"CUDA driver {ver.value}")
    else:
        env["device_name"] = platform.processor() or platform.machine()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env["compiler_version"] = subprocess.run(["clang", "--version"], capture_output=True, text=True,
                                                     timeout=10).stdout.splitlines()[0]
    return env


def _memory(device: str) -> dict[str, int | None]:
    from tinygrad.helpers import GlobalCounters
    cap = None
    if device.startswith("CUDA"):
        from tinygrad import Device
        from tinygrad.runtime.autogen import cuda
        total = ctypes.c_size_t()
        cuda.cuDeviceTotalMem_v2(ctypes.byref(total), Device[device].cu_device)
        cap = total.value
    elif hasattr(os, "sysconf"):
        cap = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"peak_bytes": int(GlobalCounters.mem_used), "capacity_bytes": cap}


def _buffer_ids(tensors) -> set[int]:
    """Identities of the realized base buffers behind some tensors (unrealized ones are skipped)."""
    out = set()
    for t in tensors:
        base = t.uop.base
        if base.is_realized:
            out.add(id(base.buffer.base))
    return out


def prompt_tokens(context: int, vocabulary: int) -> list[int]:
    """A fixed prompt of `context` tokens (at least one), the same for every run of a model."""
    return [1] + [(7919 * i) % vocabulary for i in range(1, max(1, context))]


def profile(model: str, device: str, context: int, tokens: int, warmup: int = 3, model_hash: bool = True,
            beam: int = 0, timing: str | None = None, progress: Callable[[str, int], None] | None = None) -> Trace:
    """Run decode in tinygrad and return the trace. `device` must already be tinygrad's DEV.
    With beam > 0, tinygrad's BEAM search chooses the decode kernels' opts (the prefill keeps the
    heuristics: its kernels never run in a measured token). `timing` is how the kernel pass times
    kernels: "launch" (the default) launches them one by one and times each launch; "graph" (CUDA
    only) records an event node before and after every kernel node of the JIT's CUDA graphs, so
    kernels run concurrently as users run them, at the price of the event nodes (on the H200 they
    added 2.8% to the token of a 5 GB model: bench/h200/README.md)."""
    if tokens < 1 or warmup < 3 or context < 0:
        raise BadInput("need --tokens >= 1, --warmup >= 3 (the JIT captures on its second call) and --context >= 0")
    census = take_census(model)
    if census.unclassified:
        raise BadInput(f"model {model}: {len(census.unclassified)} tensor(s) unclassified (adapter-incomplete); "
                       f"run `boltbeam inspect --strict` for the list")
    path = pathlib.Path(model)
    prompt = prompt_tokens(context, census.facts.vocabulary)
    needed = len(prompt) + 2 * (warmup + tokens) + 2
    # The KV cache is allocated for max_context positions; a round size well past what the run needs
    # keeps tinygrad's kernels the ones a chat session gets (reads stay bounded by the position).
    max_context = max(needed, min(census.facts.context_length or needed, 4096))
    if census.facts.context_length and needed > census.facts.context_length:
        raise BadInput(f"context {context} plus {2 * (warmup + tokens)} decoded tokens exceeds the model's "
                       f"context length {census.facts.context_length}")
    tick = progress or (lambda stage, n: None)
    rec = Recorder(device, timing or "launch")
    # tinygrad copies its executors' globals when it first compiles them, so the hook goes in
    # before anything runs; it records nothing until `active` is set.
    with rec.install():
        return _two_passes(path, census, device, prompt, max_context, tokens, warmup, model_hash, beam, rec, tick)


def _two_passes(path, census, device, prompt, max_context, tokens, warmup, model_hash, beam, rec, tick) -> Trace:
    from tinygrad import Context, Device
    from tinygrad.engine.jit import TinyJit
    from tinygrad.llm.model import Transformer

    net, _ = Transformer.from_gguf(path, max_context)
    gen = net.generate(list(prompt))
    out_tokens: list[int] = []

    # Pass 1: the graph, as users get it. Warm-up tokens keep compilation (and any search) out of the
    # numbers; the first one is the prefill, the next ones run and capture the decode JIT.
    # tinygrad 0.13.0 builds a CUDA graph with every symbolic size at 0, which a chunked prefill's
    # token count cannot be: the prefill runs its kernels one by one (it is never measured).
    with Context(JIT=2):
        out_tokens.append(next(gen))
    tick("prefill", 1)
    with Context(BEAM=beam):
        for _ in range(warmup - 1):
            out_tokens.append(next(gen))
            tick("warm-up", 1)
    walls = []
    for _ in range(tokens):
        t0 = time.perf_counter()
        out_tokens.append(next(gen))
        walls.append((time.perf_counter() - t0) * 1e6)
        tick("graph", 1)
    memory = _memory(device)

    # Pass 2: capture again without the graph and record every kernel.
    dev = Device[device]
    kv_bases = _buffer_ids(b.cache_kv for b in net.blk if hasattr(b, "cache_kv"))
    rope_bases = _buffer_ids(b.freqs_cis for b in net.blk if hasattr(b, "freqs_cis"))
    classifier = Classifier(census, path.stat().st_size, kv_bases, rope_bases)
    net.rollout_jit = TinyJit(net.forward)
    rec.instrument_graphs = rec.timing == "graph"
    kernels: list[Kernel] = []
    kernel_walls: list[float] = []
    depths: list[int] = []
    with Context(JIT=2, BEAM=beam) if rec.timing == "launch" else Context(BEAM=beam):
        for _ in range(warmup):
            next(gen)
            tick("warm-up", 1)
        for tok in range(tokens):
            rec.active = True
            dev.synchronize()
            t0 = time.perf_counter()
            next(gen)
            dev.synchronize()
            kernel_walls.append((time.perf_counter() - t0) * 1e6)
            rec.active = False
            depths.append(len(prompt) + len(out_tokens) + warmup + tok)
            timeline = rec.timeline()
            if not timeline:
                raise Refused("adapter-incomplete: tinygrad ran this token's kernels where the recorder could not "
                              "see them (was tinygrad already running in this process before profile?)")
            for i, (launch, start_s, dur_s) in enumerate(timeline):
                category, role, names = classifier.classify(launch)
                kernels.append(Kernel(token=tok, index=i, name=launch.name, duration_us=dur_s * 1e6,
                                      start_us=start_s * 1e6, role=role, category=category, tensors=names,
                                      bytes=launch.mem, flops=launch.ops, global_size=launch.global_size,
                                      local_size=launch.local_size, opts=launch.opts))
            tick("kernels", 1)
    return Trace(
        environment=_environment(device, path, model_hash),
        workload={"context": len(prompt), "tokens": tokens, "warmup": warmup, "batch": 1,
                  "kernel_pass_depths": depths, "prompt": "boltbeam.measure.tinygrad_run.prompt_tokens"},
        route={"label": f"tinygrad-beam-{beam}" if beam else "tinygrad-scheduler",
               "switch": "boltbeam profile --beam 0" if beam else None,
               "settings": {"beam": beam, "beam_scope": "decode JIT" if beam else None,
                            **{k: os.environ[k] for k in ("BEAM", "JITBEAM", "HALF") if k in os.environ}}},
        token_wall_us=walls, output_tokens=out_tokens, memory=memory,
        kernel_pass_wall_us=kernel_walls, kernels=kernels,
        provenance={"source": "profile", "tool_version": __version__,
                    "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "timing": TIMING[rec.timing if rec.events else "wait"],
                    "inputs": [{"path": str(path), "sha256": None}]})
