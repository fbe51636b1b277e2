"""The tinygrad adapter: decode through tinygrad's own model code and write one trace.

Plain tokens and timed tokens over one loaded model:
  - plain: the JIT with its graphs, as users run it, nothing recording but marks: the host's clock at
    the token's first kernel launch, and brackets before that launch and after each one (CUDA events,
    whose host cost is not measured yet; on the CPU the device's own stamps, tens of µs each);
    each token's wall.
  - timed: every kernel recorded (name, launch dimensions, opts, tinygrad's own estimates, the buffers
    it touches) with its time on the device timeline of the graph replay itself: CUPTI records on
    CUDA, tinygrad's own graph timestamps on command-queue devices such as the CPU (there in a second
    JIT, its tokens interleaved with the plain ones). `--timing launch` (CUDA) launches kernels one
    by one instead, where no in-graph timing can be had, and the trace says so.
  - on CUDA, where asked (switches.CUPTI_PER_LAUNCH: it crashed cuGraphLaunch on an H200), beside each
    timed token one timed per launch: CUPTI's graph records alone (each graph's device start and end, no
    kernel instrumented), so the device time recording every kernel adds, and the launch and sync of a
    token nearly plain, are measured on the tokens themselves.
  Per timed token the trace also keeps the JIT replays and graph launches the host made, and per
  token (plain and timed) the host's time before its first launch and its bracket: the
  account counts launch and synchronization cost on them.
Weights stay views of the GGUF file's buffer, so a view's offset is a tensor's data offset in the
file: that maps each kernel to the tensors it reads, and so to roles. A kernel that reads no weight
is classified by the buffers it touches (KV cache, rope table, logits) and by what it does.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import dataclasses
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

from boltbeam import __version__, switches
from boltbeam.errors import BadInput, Refused
from boltbeam.files import replaceable, sha256_file, write_atomic
from boltbeam.measure.graph_timing import (Cupti, KernelRecord, LaunchFacts, LaunchTimed, Segment, alternate, dims3,
                                           hcq_times, launch_fields, launch_timed, match_records,
                                           split_by_token)
from boltbeam.measure import programs, seam
from boltbeam.measure.prepared import Prepared
from boltbeam.measure.route import Route, routed_label
from boltbeam.measure.route import install as route_install
from boltbeam.measure.trace import (TIMINGS, Environment, Kernel, KernelPass, Memory, Phases, Provenance, RouteRecord,
                                    Trace, Workload)
from boltbeam.read.census import Census, TensorEntry, take_census
from boltbeam.read.roles import ROLES

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NORM_ROLES = {r for r, (kind, _) in ROLES.items() if kind == "vector"}


@dataclass
class Launch:
    """One kernel launch as tinygrad described it: its facts, never its time."""
    name: str
    op: str                      # "kernel" or "copy"
    global_size: list[int] | None
    local_size: list[int] | None
    opts: list[str] | None
    ops: int | None
    mem: int | None
    reads: list[Any]             # tinygrad Buffers
    writes: list[Any]
    function: str | None = None  # the compiled kernel's function name, as a device profiler reports it


class _CudaEvents:
    """A pool of CUDA events recorded on the launch stream around each kernel; read once per token."""
    def __init__(self):
        from tinygrad.runtime.autogen import cuda
        self.cuda, self.pool, self.used = cuda, [], 0

    def record(self):
        if self.used == len(self.pool):
            ev = self.cuda.CUevent()
            self.cuda.cuEventCreate(ctypes.byref(ev), 0)
            self.pool.append(ev)
        self.used += 1
        ev = self.pool[self.used - 1]
        self.cuda.cuEventRecord(ev, None)
        return ev

    def elapsed_ns(self, a, b) -> int:
        ms = ctypes.c_float()
        self.cuda.cuEventElapsedTime(ctypes.byref(ms), a, b)
        return round(ms.value * 1e6)


class _CudaBracket:
    """Two CUDA events on the launch stream: one before a token's first kernel launch, one re-recorded
    after each launch, so they span the device time of the token's kernels without CUPTI."""
    def __init__(self):
        self.events = _CudaEvents()   # a pool of two, created on first use

    def first(self):
        self.events.used = 0
        self.start = self.events.record()

    def last(self):
        self.events.used = 1
        self.end = self.events.record()

    def elapsed_us(self) -> float:
        return self.events.elapsed_ns(self.start, self.end) / 1e3


class _HcqBracket:
    """The same on tinygrad's command-queue devices (the CPU and others): two signals the device stamps
    with its own clock when it reaches them, after everything submitted before."""
    def __init__(self, device: str):
        self.device, self.signals = device, []

    @staticmethod
    def serves(device: str) -> bool:
        """A device with tinygrad's command queues (an opened one: this asks tinygrad for it)."""
        from tinygrad import Device
        from tinygrad.runtime.support.hcq import HCQCompiled
        return isinstance(Device[device], HCQCompiled)

    def _stamp(self, signal):
        d = self.dev
        d.hw_compute_queue_t().wait(d.timeline_signal, d.timeline_value - 1).timestamp(signal) \
            .signal(d.timeline_signal, d.next_timeline()).submit(d)

    def first(self):
        if not self.signals:   # created on first use, once tinygrad has opened the device
            from tinygrad import Device
            self.dev = Device[self.device]
            self.signals = [self.dev.new_signal(), self.dev.new_signal()]
        self._stamp(self.signals[0])

    def last(self):
        self._stamp(self.signals[1])

    def elapsed_us(self) -> float:
        return float(self.signals[1].timestamp - self.signals[0].timestamp)   # tinygrad's µs


@dataclass
class Call:
    """What the host ran in a timed token: a whole graph, or one kernel or copy outside any graph."""
    graph: Any | None            # tinygrad's graph runner, for a graph
    var_vals: dict[str, int]
    ast: Any = None              # the program or copy, outside a graph
    bufs: list[Any] | None = None
    events: tuple | None = None  # (start, end) CUDA events around it, with launch timing

    def launches(self) -> list[Launch | None]:
        """Its launches in order (None for a graph call that is neither a program nor a copy)."""
        if self.graph is None:
            return [launch_of(self.ast, self.bufs, self.var_vals)]
        from tinygrad.uop.ops import Ops
        return [launch_of(ast, bufs, self.var_vals) if ast.op in (Ops.PROGRAM, Ops.COPY) else None
                for _, ast, bufs, _ in self.graph.calls]


@dataclass
class Recorder:
    """Sees every launch of a measured token through tinygrad's per-call stats hook. It keeps only
    references while the token runs (the hook sits on the hot path) and builds launches after."""
    device: str
    timing: str                   # a key of trace.TIMINGS
    active: bool = False
    calls: list[Call] = field(default_factory=list)
    jit_calls: int = 0
    events: _CudaEvents | None = None
    # Every token, plain and timed: the clock read at its first kernel launch (the host's part before it),
    # and brackets before that launch and after its last (CUDA events with CUPTI timing, the device's own
    # stamps on command-queue devices), so the device time the timing adds is measured apart from it
    clock: Callable[[], int] = time.perf_counter_ns
    opened_ns: int | None = None
    brackets: _CudaBracket | _HcqBracket | None = None

    def __post_init__(self):
        if self.timing == "launch":
            self.events = _CudaEvents()
        if self.brackets is None and self.timing == "cupti":
            self.brackets = _CudaBracket()
        elif self.brackets is None and self.timing == "hcq" and _HcqBracket.serves(self.device):
            self.brackets = _HcqBracket(self.device)

    @contextlib.contextmanager
    def install(self):
        """Wrap tinygrad's per-call stats hook and its JIT replay, recording nothing until `active`
        (but the brackets, in every token)."""
        from tinygrad.engine import jit, realize
        from tinygrad.uop.ops import Ops
        orig_track, orig_run = realize.track_stats, jit.run_linear
        rec = self

        @contextlib.contextmanager
        def recorded(ctx, call, device, bufs, var_vals):
            ast = call.src[0]
            if not rec.active:
                with orig_track(ctx, call, device, bufs, var_vals) as et:
                    yield et
                return
            if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph":
                rec.calls.append(Call(realize.get_graph_runtime(ast), var_vals))
            elif ast.op in (Ops.PROGRAM, Ops.COPY):
                start = rec.events.record() if rec.events else None
                with orig_track(ctx, call, device, bufs, var_vals) as et:
                    yield et
                rec.calls.append(Call(None, var_vals, ast, bufs, (start, rec.events.record()) if rec.events else None))
                return
            with orig_track(ctx, call, device, bufs, var_vals) as et:
                yield et

        @contextlib.contextmanager
        def track_stats(ctx, call, device, bufs, var_vals):
            ast = call.src[0]
            launches = ast.op is Ops.PROGRAM or (ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph")
            if launches and rec.opened_ns is None:
                rec.opened_ns = rec.clock()
                if rec.brackets:
                    rec.brackets.first()
            with recorded(ctx, call, device, bufs, var_vals) as et:
                yield et
            if rec.brackets and launches:
                rec.brackets.last()

        def run_linear(*args, **kwargs):
            if rec.active and kwargs.get("jit"):
                rec.jit_calls += 1
            return orig_run(*args, **kwargs)

        realize.track_stats, jit.run_linear = track_stats, run_linear
        try:
            yield self
        finally:
            realize.track_stats, jit.run_linear = orig_track, orig_run

    def bracket_us(self) -> float | None:
        """This token's bracket, read after it synchronized."""
        return self.brackets.elapsed_us() if self.brackets and self.opened_ns is not None else None

    def take(self) -> tuple[list[Call], int]:
        """This token's calls and JIT replays; the recorder starts the next token empty."""
        calls, jit_calls = self.calls, self.jit_calls
        self.calls, self.jit_calls = [], 0
        if self.events:
            self.events.used = 0
        return calls, jit_calls


def launch_of(ast, bufs, var_vals) -> Launch:
    """A launch's facts from tinygrad's own program info and estimates."""
    from tinygrad.uop.ops import Ops, sym_infer
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
                  writes=[b for i, b in enumerate(bufs) if i in outs], function=info.function_name)


def _facts(launch: Launch) -> LaunchFacts:
    return LaunchFacts(launch.function, dims3(launch.global_size), dims3(launch.local_size))


# (launch, start ns, end ns on the timing's clock, the host launch it ran in: its call's number in the
# token, a graph or one kernel), in launch order
Timed = list[tuple[Launch, int, int, int]]


def launch_timeline(calls: list[Call], events: _CudaEvents) -> Timed:
    """One by one (JIT=2): CUDA events around each launch, read after the token synchronized."""
    first = calls[0].events[0]
    return [(c.launches()[0], events.elapsed_ns(first, c.events[0]), events.elapsed_ns(first, c.events[1]), n)
            for n, c in enumerate(calls)]


def cupti_timeline(calls: list[Call], records: list[KernelRecord], where: str) -> tuple[Timed, int]:
    """The token's kernels matched to CUPTI's records; copies are not kernel records and stay out.
    Returns the timeline and the number of copies left out."""
    segments, launches, copies = [], [], 0
    for n, c in enumerate(calls):
        ls = c.launches()
        kernels = [l for l in ls if l is not None and l.op == "kernel"]
        copies += sum(1 for l in ls if l is not None and l.op == "copy")
        if kernels:
            segments.append(Segment(c.graph is not None, [_facts(l) for l in kernels]))
            launches.append((n, kernels))
    matched = match_records(segments, records, where)
    return [(l, r.start_ns, r.end_ns, n) for (n, ls), rs in zip(launches, matched) for l, r in zip(ls, rs)], copies


def hcq_timeline(calls: list[Call], stamps: list[list[tuple[int, int]] | None], where: str) -> Timed:
    """The token's kernels with the timestamps their graphs wrote (`stamps`: each call's, read as the token
    ended: a graph's hold only its last replay), by place in the graph."""
    timed, seen = [], set()
    for n, c in enumerate(calls):
        if c.graph is None:
            if c.launches()[0].op == "kernel":
                raise Refused(f"adapter-incomplete: {where}: a kernel ran outside tinygrad's graphs, where no "
                              f"timestamps are written")
            continue
        if id(c.graph) in seen:
            raise Refused(f"adapter-incomplete: {where}: one graph replayed twice in a token; its timestamps "
                          f"hold only the last replay")
        seen.add(id(c.graph))
        for launch, times in zip(c.launches(), stamps[n], strict=True):
            if launch is not None and launch.op == "kernel":
                timed.append((launch, *times, n))
    return timed


class Classifier:
    """Maps a launch to (category, role, tensors) from the buffers it touches, never from tensor or
    model names; only a kernel that touches nothing it can place falls back on tinygrad's kind prefix.
    Launches are classified in launch order: a kernel that reads only what attention kernels wrote (a
    softmax between the score and value kernels, a split attention's combine) is attention's too."""
    def __init__(self, census: Census, file_size: int, kv_bases: set[int], rope_bases: set[int],
                 placed: dict[int, tuple[TensorEntry, ...]] | None = None):
        self.placed = placed or {}
        self.last_writer: dict[int, str] = {}     # buffer identity -> the category of the kernel that last wrote it
        self.tensors = sorted((t for t in census.tensors if not t.tied), key=lambda t: t.data_offset)
        self.offsets = [t.data_offset for t in self.tensors]
        self.file_size, self.kv_bases, self.rope_bases = file_size, kv_bases, rope_bases
        self.logits_bytes = {census.facts.vocabulary * n for n in (2, 4)}
        self.tied = census.tied_embeddings

    def _tensors_at(self, buf) -> tuple[TensorEntry, ...]:
        if (ts := self.placed.get(id(buf.base))) is not None:
            return ts
        if buf._base is None or buf.base.nbytes != self.file_size:
            return ()
        i = bisect.bisect_right(self.offsets, buf.offset) - 1
        if i >= 0 and buf.offset < self.offsets[i] + self.tensors[i].bytes:
            return (self.tensors[i],)
        return ()

    def classify(self, l: Launch) -> tuple[str, str | None, list[str]]:
        category, role, names = self._classify(l)
        for b in l.writes:
            self.last_writer[id(b.base)] = category
        return category, role, names

    def _classify(self, l: Launch) -> tuple[str, str | None, list[str]]:
        if l.op == "copy":
            return "copy", None, []
        read = [t for b in l.reads for t in self._tensors_at(b)]
        names = sorted({t.name for t in read})
        if not l.reads:
            return "constant", None, []
        bases = lambda bs: {id(b.base) for b in bs}
        if read:
            weights = [t for t in read if t.role not in NORM_ROLES]
            if not weights and bases(l.writes) & self.kv_bases:   # norms applied as the cache is stored (rotary)
                return "kv_write", None, names
            main = max(weights or read, key=lambda t: t.bytes)
            role = main.role
            # With tied embeddings one table plays two roles: a lookup moves a row, the output
            # projection moves the whole table (tinygrad's own byte estimate tells them apart).
            if self.tied and role == "token_embd" and (l.mem or 0) >= main.bytes // 2:
                role = "output"
            return ("weights" if weights else "norm"), role, names
        if bases(l.writes) & self.kv_bases:
            return "kv_write", None, []
        if bases(l.reads) & self.kv_bases:
            return "attention", None, []
        if all(self.last_writer.get(b) == "attention" for b in bases(l.reads)):
            return "attention", None, []
        if bases(l.reads) & self.rope_bases:
            return "rope", None, []
        if any(b.nbytes in self.logits_bytes for b in l.reads) and all(b.nbytes < 64 for b in l.writes):
            return "sampling", None, []
        # tinygrad names a kernel by its kind: E_ for elementwise, r_ for one with a reduction.
        return ("elementwise" if l.name.startswith("E_") else "other"), None, []


def _environment(device: str, model: pathlib.Path, model_hash: bool) -> Environment:
    from importlib.metadata import version

    from tinygrad import Device
    dev = Device[device]
    env = Environment(
        engine="tinygrad", engine_version=version("tinygrad"), device=device,
        host=platform.node(), python=platform.python_version(), platform=platform.platform(),
        compiler=type(dev.compiler).__name__ if getattr(dev, "compiler", None) else None,
        renderer=type(dev.renderer).__name__, command=" ".join(sys.argv),
        model_path=str(model), model_sha256=sha256_file(model) if model_hash else None,
        tool=f"boltbeam {__version__}")
    if device.startswith("CUDA"):
        from tinygrad.runtime.autogen import cuda
        name = ctypes.create_string_buffer(256)
        cuda.cuDeviceGetName(name, 256, dev.cu_device)
        ver = ctypes.c_int()
        cuda.cuDriverGetVersion(ctypes.byref(ver))
        env.device_name, env.driver = name.value.decode(), f"CUDA {ver.value // 1000}.{ver.value % 1000 // 10}"
        env.arch, env.compiler_version = getattr(dev, "arch", None), f"CUDA driver {ver.value}"
    else:
        env.device_name = platform.processor() or platform.machine()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env.compiler_version = subprocess.run(["clang", "--version"], capture_output=True, text=True,
                                                  timeout=10).stdout.splitlines()[0]
    return env


def _memory(device: str) -> Memory:
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
    return Memory(int(GlobalCounters.mem_used), cap)


def _buffer_ids(tensors) -> set[int]:
    """Identities of the realized base buffers behind some tensors (unrealized ones are skipped)."""
    out = set()
    for t in tensors:
        base = t.uop.base
        if base.is_realized:
            out.add(id(base.buffer.base))
    return out


WARMUP = 3     # tokens decoded before measuring, by default: the decode JIT captures on its second call


def prompt_tokens(context: int, vocabulary: int) -> list[int]:
    """A fixed prompt of `context` tokens (at least one), the same for every run of a model."""
    return [1] + [(7919 * i) % vocabulary for i in range(1, max(1, context))]


def profile_elsewhere(model: str, device: str, out: str, *flags: str, gpu: str | None = None) -> str | None:
    """`boltbeam profile` in a fresh process (the adapter's hooks must be in before tinygrad first
    compiles, so a process that already ran tinygrad profiles in another), on the GPU `gpu` alone where given;
    None when it wrote `out`, else the last line of what it said."""
    cmd = [sys.executable, "-m", "boltbeam", "profile", str(model), "--device", device, "--out", str(out), "--json",
           *flags]
    env = None if gpu is None else {**os.environ, switches.VISIBLE_DEVICES.name: gpu}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no message"])[-1]


def kv_positions(census: Census, needed: int) -> int:
    """The KV cache's positions: a round size well past what a run needs keeps tinygrad's kernels the
    ones a chat session gets (reads stay bounded by the position); the kernels' ASTs, and so a route's
    kernel keys, depend on it, so every run of a model takes the same."""
    return max(needed, min(census.facts.context_length or needed, 4096))


def default_timing(device: str) -> str:
    """In-graph timing wherever tinygrad's graphs can be timed: CUPTI on CUDA, timestamps elsewhere."""
    return "cupti" if device.startswith("CUDA") else "hcq"


def decoded(tokens: int, warmup: int, timing: str, host_profile: bool = False) -> int:
    """The most tokens a profile decodes after its prefill: each pass's warm-ups (hcq captures a second JIT for its
    timed tokens), the plain and timed tokens, one more timed per launch beside each timed one on CUDA, and the
    host profile's."""
    passes = 3 if timing == "hcq" else 2
    return passes * warmup + (2 + (timing == "cupti") + host_profile) * tokens


def profile(model: str, device: str, context: int, tokens: int, warmup: int = WARMUP, model_hash: bool = True,
            beam: int = 0, timing: str | None = None, progress: Callable[[str, int], None] | None = None,
            route: tuple[str, Route] | None = None,
            prepare: list[Callable[[Any, Census, str], Prepared]] | None = None,
            host_profile: str | None = None) -> Trace:
    """Run decode in tinygrad and return the trace. `device` must already be tinygrad's DEV.
    With beam > 0, tinygrad's BEAM search chooses the decode kernels' opts (the prefill keeps the
    heuristics: its kernels never run in a measured token). `timing` is a key of trace.TIMINGS:
    "cupti" (CUDA) and "hcq" (tinygrad's command-queue graphs, e.g. CPU) time the graph replay users
    run; "launch" (CUDA) launches the kernels one by one instead and says so. `route` (path, route):
    the kernels it names are compiled with its opts, and the trace counts how many were. `prepare`:
    generated route families, each (model, census, path) -> Prepared, called on the loaded model
    before anything runs (new weight layouts, constants computed once); the trace says what each changed.
    `host_profile`: a file for where the host's time goes in `tokens` plain tokens more, decoded under Python's
    profiler after the measured ones (so it changes none of them)."""
    if tokens < 1 or warmup < 3 or context < 0:
        raise BadInput("need --tokens >= 1, --warmup >= 3 (the JIT captures on its second call) and --context >= 0")
    timing = timing or default_timing(device)
    if timing in ("cupti", "launch") and not device.startswith("CUDA"):
        raise BadInput(f"--timing {timing} needs CUDA; on {device} the kernels are timed by tinygrad's own graph timestamps")
    started = time.perf_counter()
    if host_profile:
        if timing == "launch":
            raise BadInput("--host-profile profiles the graph replay users run: not with --timing launch (no graphs)")
        replaceable(host_profile)        # before minutes of loading: a folder or a link there is one line now
    census = take_census(model)
    if census.unclassified:
        raise BadInput(f"model {model}: {len(census.unclassified)} tensor(s) unclassified (adapter-incomplete); "
                       f"run `boltbeam inspect --strict` for the list")
    open_device(device)
    seam.check()                                      # every patch point where this code reaches it, before loading
    cupti = Cupti() if timing == "cupti" else None    # fails here, before minutes of loading, if it is missing
    path = pathlib.Path(model)
    prompt = prompt_tokens(context, census.facts.vocabulary)
    needed = len(prompt) + decoded(tokens, warmup, timing, bool(host_profile)) + 2
    max_context = kv_positions(census, needed)
    if census.facts.context_length and needed > census.facts.context_length:
        raise BadInput(f"context {context} plus {needed - len(prompt)} decoded tokens exceeds the model's "
                       f"context length {census.facts.context_length}")
    rec = Recorder(device, timing)
    # tinygrad copies its executors' globals when it first compiles them, so the hook goes in
    # before anything runs; it records nothing until `active` is set.
    with rec.install(), route_install(route[1].opts_by_kernel() if route else {}) as applied, programs.kept():
        run = _Run(path, census, device, prompt, max_context, tokens, warmup, beam, rec, cupti, progress, prepare,
                   started)
        run.route = (route[0], route[1], applied) if route else None
        run.applied = applied
        trace = run.trace(model_hash)
        if host_profile:
            run.host_profile(host_profile)
        return trace


def open_device(device: str) -> None:
    """Open the device before loading minutes of weights; a machine without it is bad input."""
    from tinygrad import Device
    try:
        Device[device]
    except Exception as e:   # tinygrad raises whatever its runtime loader raised (no library, no driver, no GPU)
        raise BadInput(f"tinygrad cannot open {device} here ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class _Step:
    """One decoded token as the host saw it."""
    wall_us: float
    started_ns: int                 # its start, on the recorder's clock
    host_us: float | None           # its start to its first kernel launch (None: it launched nothing)
    bracket_us: float | None        # the brackets around its launches, where the timing keeps them


@dataclass
class _TimedToken:
    step: _Step
    calls: list[Call]
    jit_calls: int
    marks_ns: tuple[int, int] | None          # host marks before and after, on the timeline's clock
    timeline: Timed = field(default_factory=list)

    @property
    def first_ns(self) -> int:
        return min(start for _, start, _, _ in self.timeline)

    @property
    def lead_us(self) -> float:
        """Host mark before the token to its first kernel's start: the launch as the device saw it."""
        return (self.first_ns - self.marks_ns[0]) / 1e3

    @property
    def trail_us(self) -> float:
        """Last kernel's end to the host mark after the token: synchronization and read-back."""
        return (self.marks_ns[1] - max(end for _, _, end, _ in self.timeline)) / 1e3


# prompt tokens a chunked prefill call takes at most (llama.cpp's default micro-batch): each call builds the model's
# graph again, so a 512-token prompt goes in one call, not tinygrad.llm's 16 of 32
PREFILL_MOST = 512
# the most seconds a prompt may be projected to spend going through the decode step a token at a time; past it the
# rest takes the chunked prefill. A chunked prefill of 512 tokens took 28-51 s of an 8B-shaped profile on an H100
# (2026-12-07, bench/h200/s20), most of it the host building and scheduling the model's graph; a route of 6 ms a
# token would step through the same prompt in ~3 s (not yet measured on a GPU)
PREFILL_STEP_SECONDS = 30.0
PREFILL_PROBE = 8       # decode steps timed, once the JIT replays, to project the rest of the prompt


def start_decode(net, prompt: list[int], beam: int = 0):
    """The model's token generator and its first token, the prompt decoded as every profile decodes it (never
    measured). A prompt of 3 tokens or more runs through the decode step itself, a token a call, with the decode's
    BEAM, as long as the steps timed once its JIT replays project the rest within PREFILL_STEP_SECONDS: a
    prefill call's kernels cost more to build than the steps they save wherever the decode is fast (on the CPU,
    7.5 of a tiny profile's 15 s). Its tokens go in as the decode's own input does (a (1, 1) tensor, no symbolic
    count), so the JIT the first two capture holds the kernels a chat session's decode runs; the last token goes
    through generate (its cache taken as filled), a replay of that JIT. The rest of a prompt whose steps are too
    slow, and a prompt of 1 or 2 tokens, take tinygrad's chunked prefill in calls of up to PREFILL_MOST tokens, its
    kernels one by one: 0.13.0 builds a CUDA graph with every symbolic size at 0, which a chunk's token count
    cannot be."""
    from array import array

    from tinygrad import Context, Device, Tensor, UOp
    steps = len(prompt) - 1 if len(prompt) >= 3 else 0
    start_pos = UOp.variable("start_pos", 0, net.max_context - 1)
    temperature = Tensor(0.0).contiguous()
    probe = (2, 2 + PREFILL_PROBE)      # from the first replay (the JIT captures on its second call)
    # One input buffer, each step's token copied into it once the step before has run (as generate reads each token
    # back before the next): a new tensor a step has the host schedule its copy every step. On an H100 those steps
    # ran ~27 ms against a 5.7 ms token (bench/h200/s21/); on the CPU, a tiny model's step went 11.6 -> 8.0 ms.
    step_input = Tensor([prompt[0] if prompt else 0], dtype="int32").reshape(1, 1).contiguous().realize()
    written = step_input.uop.base.realized
    with Context(BEAM=beam):
        for i, token in enumerate(prompt[:steps]):
            Device[Device.DEFAULT].synchronize()
            if i in probe:
                if i == probe[0]:
                    began = time.perf_counter()
                elif (time.perf_counter() - began) / PREFILL_PROBE * (steps - i) > PREFILL_STEP_SECONDS:
                    steps = i
                    break
            written.copyin(memoryview(array("i", [token])).cast("B"))
            net(step_input, start_pos.bind(i), temperature).realize()
    net._cached_tokens = list(prompt[:steps])
    if steps == len(prompt) - 1:
        gen = net.generate(list(prompt), chunk_size=1)
        return gen, next(gen)
    gen = net.generate(list(prompt), chunk_size=PREFILL_MOST)
    with Context(JIT=2):
        return gen, next(gen)


HOST_PROFILE_ROWS = 40      # functions a host profile lists, by each of its two orders


class _Run:
    """One loaded model decoding: the plain tokens users get and the timed tokens, one trace."""
    def __init__(self, path, census, device, prompt, max_context, tokens, warmup, beam, rec, cupti, progress, prepare,
                 started: float):
        from tinygrad import Context
        from boltbeam.measure.architectures import load
        self.marks = [started, time.perf_counter()]     # each phase's end (Phases), from the profile's start
        self.path, self.census, self.device, self.prompt = path, census, device, prompt
        self.tokens, self.warmup, self.beam, self.rec, self.cupti = tokens, warmup, beam, rec, cupti
        self.tick = progress or (lambda stage, n: None)
        self.net = load(path, max_context, census)     # tinygrad.llm's model, fitted to the file's formula
        self.marks.append(time.perf_counter())
        self.prepared = [family(self.net, census, str(path)) for family in prepare or []]
        self.marks.append(time.perf_counter())
        self.gen, first = start_decode(self.net, prompt, beam)
        self.out_tokens: list[int] = [first]
        self.marks.append(time.perf_counter())
        self.tick("prefill", 1)
        # Warm-up tokens keep compilation (and any search) out of the numbers; they run and capture the decode JIT.
        with Context(BEAM=beam):
            for _ in range(warmup - 1):
                self._next("warm-up")
        self.marks.append(time.perf_counter())

    def _next(self, stage: str) -> _Step:
        """Decode one token."""
        self.rec.opened_ns = None
        started = self.rec.clock()
        t0 = time.perf_counter()
        self.out_tokens.append(next(self.gen))
        wall = (time.perf_counter() - t0) * 1e6
        opened = self.rec.opened_ns
        self.tick(stage, 1)
        return _Step(wall, started, None if opened is None else (opened - started) / 1e3, self.rec.bracket_us())

    def _timed(self, stage: str) -> _TimedToken:
        """One recorded token, with host marks at its start and after it on the timing's own clock."""
        self.rec.active = True
        step = self._next(stage)
        self.rec.active = False
        after = self.rec.clock()
        calls, jit_calls = self.rec.take()
        return _TimedToken(step, calls, jit_calls, (step.started_ns, after))

    def host_profile(self, out: str) -> None:
        """`tokens` plain tokens more under cProfile, its report written to `out`: the functions that hold
        the host's time (cumulative, then their own), for every token together."""
        import cProfile
        import io
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(self.tokens):
            self._next("host profile")
        profiler.disable()
        text = io.StringIO()
        text.write(f"# the host's time over {self.tokens} plain decode tokens (Python's cProfile; its own cost "
                   f"slows the host, not the device)\n")
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(HOST_PROFILE_ROWS)
        stats.sort_stats("tottime").print_stats(HOST_PROFILE_ROWS)
        write_atomic(out, text.getvalue())

    def trace(self, model_hash: bool) -> Trace:
        where = f"{self.device}, timing {self.rec.timing}"
        plain, timed, notes = {"hcq": self._hcq, "cupti": self._cupti, "launch": self._launch}[self.rec.timing](where)
        self.marks.append(time.perf_counter())
        for t in timed:
            if not t.timeline:
                raise Refused("adapter-incomplete: tinygrad ran this token's kernels where the recorder could not "
                              "see them (was tinygrad already running in this process before profile?)")
        return self._trace(plain, timed, _memory(self.device), notes, model_hash)

    def _hcq(self, where: str) -> tuple[list[_Step], list[_TimedToken], list[str]]:
        """A second decode JIT whose graphs write timestamps; measured tokens alternate between the two
        JITs, so drift on a shared machine falls on both alike."""
        from tinygrad import Context
        from tinygrad.engine.jit import TinyJit
        net = self.net
        plain, timed_jit = net.rollout_jit, TinyJit(net.forward)
        net.rollout_jit = timed_jit
        with Context(PROFILE=1, BEAM=self.beam):
            for _ in range(self.warmup):
                self._next("warm-up")
        steps, timed, stamps = [], [], []
        for _ in range(self.tokens):
            net.rollout_jit = plain
            steps.append(self._next("plain"))
            net.rollout_jit = timed_jit
            timed.append(self._timed("timed"))
            # only the stamps now (a graph's hold only its last replay): the launches' facts after the last token,
            # so no plain token follows the host's work on the one before
            stamps.append([hcq_times(c.graph) if c.graph is not None else None for c in timed[-1].calls])
        net.rollout_jit = plain
        for t, s in zip(timed, stamps):
            t.timeline = hcq_timeline(t.calls, s, where)
        return steps, timed, []

    def _cupti(self, where: str) -> tuple[list[_Step], list[_TimedToken], list[str]]:
        """Plain tokens, then CUPTI on (after the capture, so it sees the graphs' kernels), each timed token
        followed by one timed per launch (CUPTI's per-kernel activity off), flushed once."""
        from tinygrad import Context
        steps = [self._next("plain") for _ in range(self.tokens)]
        self.cupti.start()
        self.rec.clock = self.cupti.now_ns   # the timed tokens' marks on CUPTI's clock, as their kernels
        timed, launched, notes = [], [], []
        with Context(BEAM=self.beam):
            for _ in range(self.tokens):
                self.cupti.per_kernel()
                timed.append(self._timed("timed"))
                if notes or (said := self.cupti.per_launch()):
                    notes = notes or [said]
                    continue
                launched.append(self._timed("timed per launch"))
        records = self.cupti.stop()
        self.decoded_per_launch = len(launched)
        if len(launched) != len(timed):     # CUPTI refused graph records (or refused them part way): none kept
            launched = []
        if launched:
            marks = [t.marks_ns for pair in zip(timed, launched) for t in pair]
            per_token, graphs, calls = alternate(records, marks, where)
        else:
            marks = [t.marks_ns[0] for t in timed] + [timed[-1].marks_ns[1] + 1]
            per_token = split_by_token(records.kernels, marks, where)
        copies = 0
        for i, (t, rs) in enumerate(zip(timed, per_token)):
            t.timeline, copies = cupti_timeline(t.calls, rs, f"{where}, token {i}")
        if copies:
            notes.append(f"{copies} copy(ies) per token are not kernel records: their time lies in the gaps or outside "
                         f"the device span")
        if any(c.graph is None and c.launches()[0].op == "kernel" for t in launched for c in t.calls):
            notes.append("kernels ran outside graphs, which graph records do not see: the tokens timed per launch are "
                         "left out")
        elif launched:
            # the host's time to its first launch as tinygrad's hook marks it, as the plain tokens' (the launch call
            # CUPTI sees comes after tinygrad has prepared the graph's arguments)
            self.launched = [dataclasses.replace(launch_timed(t.marks_ns, t.step.wall_us, g, c,
                                                              sum(1 for x in t.calls if x.graph is not None),
                                                              f"{where}, token {i} timed per launch"),
                                                 host_us=t.step.host_us)
                             for i, (t, g, c) in enumerate(zip(launched, graphs, calls))]
        return steps, timed, notes

    def _launch(self, where: str) -> tuple[list[_Step], list[_TimedToken], list[str]]:
        """Plain tokens, then the JIT captured again without graphs (JIT=2), CUDA events around each launch."""
        from tinygrad import Context, Device
        from tinygrad.engine.jit import TinyJit
        steps = [self._next("plain") for _ in range(self.tokens)]
        self.net.rollout_jit = TinyJit(self.net.forward)
        timed = []
        with Context(JIT=2, BEAM=self.beam):
            for _ in range(self.warmup):
                self._next("warm-up")
            for _ in range(self.tokens):
                Device[self.device].synchronize()
                t = self._timed("timed")
                Device[self.device].synchronize()
                t.timeline, t.marks_ns = launch_timeline(t.calls, self.rec.events) if t.calls else [], None
                timed.append(t)
        return steps, timed, []

    launched: list[LaunchTimed] = []              # the tokens timed per launch beside the timed ones (CUDA)
    decoded_per_launch = 0                        # tokens decoded as such (kept in `launched` or not)
    route: tuple[str, Route, Any] | None = None   # (path, route, the kernels it applied to) when routed
    applied: Any = None                           # the kernels compiled with BEAM's or the route's opts

    def _route(self) -> RouteRecord:
        """The route label says what ran: a search's route only when every kernel it names was applied."""
        beam = self.beam
        env = switches.recorded()
        families = {"families": {p.family: p.summary() for p in self.prepared}} if self.prepared else {}
        prefix = routed_label([p.family + (f" (partial: {p.applied} of {p.eligible})" if p.applied < p.eligible else "")
                               for p in self.prepared], "")
        switch = f"{switches.ROUTE.name}=none (every generated family off)" if self.prepared else None
        if self.route is None:
            return RouteRecord(prefix + (f"tinygrad-beam-{beam}" if beam else "tinygrad-scheduler"),
                               switch or ("boltbeam profile --beam 0" if beam else None),
                               {"beam": beam, "beam_scope": "decode JIT" if beam else None, **families, **env,
                                **self.applied.record()})
        path, route, applied = self.route
        named, carried = {c.kernel for c in route.choices}, {c.kernel for c in route.compiled}
        ran = len(named & applied.kernels)
        return RouteRecord(prefix + ("boltbeam-search" if ran == len(named) else f"boltbeam-search (partial: {ran} of {len(named)})"),
                           f"boltbeam profile --route none (or {switches.ROUTE.name}=none)",
                           {"route": path, "family": route.family, "provenance": route.provenance,
                            "kernels_routed": len(named), "kernels_applied": ran, "beam": beam, **families, **env,
                            **({"kernels_carried": len(carried), "carried_applied": len(carried & applied.kernels)}
                               if carried else {}), **applied.record()})

    def _trace(self, plain: list[_Step], timed: list[_TimedToken], memory, notes: list[str], model_hash: bool) -> Trace:
        from importlib.metadata import version
        net, census = self.net, self.census
        kv_bases = _buffer_ids(b.cache_kv for b in net.blk if hasattr(b, "cache_kv"))
        rope_bases = _buffer_ids(b.freqs_cis for b in net.blk if hasattr(b, "freqs_cis"))
        classifier = Classifier(census, self.path.stat().st_size, kv_bases, rope_bases,
                                {k: v for p in self.prepared for k, v in p.placed.items()})
        kernels: list[Kernel] = []
        for tok, t in enumerate(timed):
            t0 = t.first_ns   # inside a graph, the first node submitted need not start first
            for i, (launch, start_ns, end_ns, host_launch) in enumerate(t.timeline):
                category, role, names = classifier.classify(launch)
                kernels.append(Kernel(token=tok, index=i, name=launch.name, duration_us=(end_ns - start_ns) / 1e3,
                                      start_us=(start_ns - t0) / 1e3, launch=host_launch, role=role,
                                      category=category, tensors=names,
                                      bytes=launch.mem, flops=launch.ops, global_size=launch.global_size,
                                      local_size=launch.local_size, opts=launch.opts, reads_buffers=len(launch.reads),
                                      writes_bytes=sum(b.nbytes for b in launch.writes)))
        first_timed = len(self.prompt) + len(self.out_tokens) - len(timed) - self.decoded_per_launch
        depths = list(range(first_timed, first_timed + len(timed) + self.decoded_per_launch,
                            2 if self.decoded_per_launch else 1))
        marked = all(t.marks_ns for t in timed)
        steps = plain + [t.step for t in timed]
        bracketed = all(s.bracket_us is not None for s in steps)
        hosted = marked and all(s.host_us is not None for s in steps)   # beside the timed tokens' lead and trail
        return Trace(
            environment=_environment(self.device, self.path, model_hash),
            workload=Workload(len(self.prompt), self.tokens, self.warmup, batch=1,
                              kernel_pass_depths=depths if self.rec.timing != "hcq" else None,
                              prompt="boltbeam.measure.tinygrad_run.prompt_tokens"),
            route=self._route(),
            token_wall_us=[s.wall_us for s in plain], output_tokens=list(self.out_tokens), memory=memory,
            kernel_pass_wall_us=[t.step.wall_us for t in timed], kernels=kernels,
            kernel_pass=KernelPass(self.rec.timing, [t.jit_calls for t in timed],
                                   [sum(1 for c in t.calls if c.graph is not None) for t in timed],
                                   lead_us=[t.lead_us for t in timed] if marked else None,
                                   trail_us=[t.trail_us for t in timed] if marked else None,
                                   plain_bracket_us=[s.bracket_us for s in plain] if bracketed else None,
                                   timed_bracket_us=[t.step.bracket_us for t in timed] if bracketed else None,
                                   plain_host_us=[s.host_us for s in plain] if hosted else None,
                                   timed_host_us=[t.step.host_us for t in timed] if hosted else None,
                                   **launch_fields(self.launched)),
            provenance=Provenance("profile", __version__,
                                  dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                  timing=TIMINGS[self.rec.timing] + (f" (cupti-python {version('cupti-python')})"
                                                                     if self.rec.timing == "cupti" else ""),
                                  notes=notes + [n for p in self.prepared for n in p.notes],
                                  inputs=[{"path": str(self.path), "sha256": None}],
                                  phases=Phases(*(round(b - a, 3) for a, b in zip(self.marks, self.marks[1:])))))
