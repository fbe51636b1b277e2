"""The search's hands in tinygrad: the decode token's distinct kernels, a setting turned into tinygrad's
own opts, compiled, and timed alone on the device (the whole token is judged by `profile` instead).

Kernels are captured while tinygrad compiles the decode JIT: the AST each program was built from, and
the axes tinygrad's scheduler sees when it applies opts. A setting is applied the way a route is: the
kernel's `opts_to_apply`. Nothing here decides anything.
"""
from __future__ import annotations

import contextlib
import gc
import math
import pathlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from boltbeam.errors import BadInput
from boltbeam.measure.tinygrad_run import ANSI
from boltbeam.measure.route import RoutedOpt, kernel_key, with_opts
from boltbeam.foresight.space import KernelShape, reduce_splits

# The order opts are applied in: unroll the reduction, then the output's threads and outputs per
# thread, then the group (whose local-memory check then counts the local and upcast it multiplies).
ORDER = ("unroll", "local", "upcast", "group")
OPT_OF = {"unroll": "UNROLL", "local": "LOCAL", "upcast": "UPCAST", "group": "GROUPTOP"}


@dataclass
class Kernel:
    """What planning a kernel needs: plain data, so a search can plan on one machine and time on another."""
    shape: KernelShape
    launches: int            # launches per decode token
    bytes: int               # tinygrad's own estimates for the kernel as the heuristics built it
    flops: int
    default_opts: list[str]  # what tinygrad's heuristics applied


@dataclass
class Captured:
    """A kernel with what building it takes: tinygrad's objects, alive only in the process that captured it."""
    kernel: Kernel
    ast: Any                 # the kernel's AST as tinygrad compiles it (to_program's input)
    renderer: Any

    @property
    def shape(self) -> KernelShape:
        return self.kernel.shape


def _shape(sink, renderer, key: str, name: str) -> KernelShape:
    from tinygrad.codegen.opt.postrange import Scheduler
    from tinygrad.uop.ops import AxisType
    k = Scheduler(sink, renderer)
    k.convert_loop_to_global()
    lengths = [x if isinstance(x, int) else 0 for x in k.full_shape]   # a symbolic axis is never split

    def longest(axes: list[int]) -> int | None:
        axes = [i for i in axes if lengths[i] > 1]
        return max(axes, key=lambda i: lengths[i]) if axes else None

    out = longest(k.axes_of(AxisType.GLOBAL, AxisType.LOOP))
    red = longest(k.axes_of(AxisType.REDUCE))
    outputs = math.prod(max(1, lengths[i]) for i in k.axes_of(AxisType.GLOBAL, AxisType.LOOP))
    # Every reduction axis longer than 1 (a symbolic one counts 0: never split), in tinygrad's order.
    reduces = tuple(lengths[i] for i in k.axes_of(AxisType.REDUCE))
    return KernelShape(key, name, None if out is None else lengths[out], None if red is None else lengths[red],
                       outputs=outputs, output_axis=out, reduces=reduces)


@contextlib.contextmanager
def _hooks(sources: dict, shapes: dict):
    """Record, for each program tinygrad builds, the program, its AST and renderer, and the shape
    apply_opts sees: so every program is generated here, none taken from disk (measure/programs.py)."""
    import tinygrad.codegen as codegen
    from tinygrad.engine import realize

    from boltbeam.measure import programs
    assert not programs.active(), "capture inside programs.kept(): a program from disk calls no apply_opts"
    orig_prog, orig_apply = realize.to_program, codegen.apply_opts
    current: list[str] = []

    def to_program(ast, renderer):
        current.append(kernel_key(ast))
        try:
            prg = orig_prog(ast, renderer)
        finally:
            current.pop()
        sources[prg.key] = (prg, ast, renderer)
        return prg

    def apply_opts(sink, ren, beam=0):
        if current and current[-1] not in shapes:
            shapes[current[-1]] = (sink, ren)
        return orig_apply(sink, ren, beam=beam)

    realize.to_program, codegen.apply_opts = to_program, apply_opts
    try:
        yield
    finally:
        realize.to_program, codegen.apply_opts = orig_prog, orig_apply


def capture(model: str, census, device: str, context: int,
            progress: Callable[[str], None] = lambda s: None, prepare: list[Callable] | None = None) -> list[Captured]:
    """The distinct kernels of one decode token of `model` on `device`, with their launches per token.
    `prepare`: generated route families applied to the loaded model first, as `profile` applies them."""
    from boltbeam.measure import seam
    seam.check()                                   # before the adapter's own imports of tinygrad.llm
    from tinygrad.engine import realize
    from tinygrad.uop.ops import Ops

    from boltbeam.measure.architectures import load
    from boltbeam.measure.tinygrad_run import kv_positions, prompt_tokens, start_decode
    sources: dict = {}
    shapes: dict = {}
    with _hooks(sources, shapes):
        progress("loading")
        prompt = prompt_tokens(context, census.facts.vocabulary)
        net = load(pathlib.Path(model), kv_positions(census, len(prompt) + 8), census)
        for family in prepare or []:
            progress("building the generated route families")
            family(net, census, model)
        gen, _ = start_decode(net, prompt)
        for _ in range(3):      # the JIT captures on its second call
            progress("compiling the decode token")
            next(gen)
    captured = net.rollout_jit.captured
    if captured is None:
        raise BadInput("tinygrad did not capture a decode JIT")
    programs: Counter = Counter()
    for call in captured.linear.src:
        head = call.src[0]
        if head.op is Ops.CUSTOM_FUNCTION and head.arg == "graph":
            programs.update(a.key for _, a, _, _ in realize.get_graph_runtime(head).calls if a.op is Ops.PROGRAM)
        elif head.op is Ops.PROGRAM:
            programs[head.key] += 1
    by_kernel: dict[str, Captured] = {}
    from tinygrad.uop.ops import sym_infer
    for pkey, n in programs.items():
        prg, ast, ren = sources[pkey]
        key = kernel_key(ast)
        if key in by_kernel:
            by_kernel[key].kernel.launches += n
            continue
        info = prg.src[0].arg
        est = info.estimates
        var_vals = _mid_vals(ast)
        sink, sren = shapes[key]
        by_kernel[key] = Captured(Kernel(_shape(sink, sren, key, ANSI.sub("", info.name)), n,
                                         int(sym_infer(est.mem, var_vals)) if est else 0,
                                         int(sym_infer(est.ops, var_vals)) if est else 0,
                                         [str(o) for o in info.applied_opts]), ast, ren)
    # The model and its decode JIT go here, and their CPU graphs with them, on this thread: left to the cyclic
    # collector, a graph's __del__ can run on tinygrad's CPU worker thread and wait on that thread's own queue
    # (a search hung so in the suite, py-spy: HCQGraph.__del__ -> synchronize inside CPUWorker.run).
    del gen, net, captured
    gc.collect()
    return sorted(by_kernel.values(), key=lambda c: c.shape.key)


def _mid_vals(ast) -> dict[str, int]:
    """Symbolic sizes (the KV position) at the middle of their range, as tinygrad's own search times them."""
    return {v.expr: int(v.vmax + v.vmin) // 2 for v in ast.variables()}


def opts_of(setting: dict[str, int], shape: KernelShape) -> list[RoutedOpt]:
    """A family setting as tinygrad opts, in ORDER; a value of 1 is no opt."""
    # tinygrad numbers an opt's axis per kind: LOCAL and UPCAST among all axes, GROUPTOP among the
    # reductions, UNROLL among the reductions of a known length over 1. Unroll goes first; when it takes
    # its whole axis, that axis is gone and a group on a later one moves up one place.
    placed = reduce_splits(setting, shape)
    assert isinstance(placed, dict), placed   # BubbleBeam passed the setting
    lengths = shape.reduce_lengths()
    axis = {"local": shape.output_axis, "upcast": shape.output_axis, **placed}
    u = placed.get("unroll")
    if u is not None:
        axis["unroll"] = sum(1 for n in lengths[:u] if n > 1)
        if "group" in placed and placed["group"] > u and setting["unroll"] == lengths[u]:
            axis["group"] -= 1
    return [RoutedOpt(OPT_OF[p], axis[p], setting[p]) for p in ORDER if setting.get(p, 1) != 1]

def build(c: Captured, opts: list[RoutedOpt] | None):
    """The compiled program for these opts (None: tinygrad's own heuristics), or the compiler's refusal."""
    from tinygrad.codegen.opt import Opt, OptOps
    return compile_ast(c.ast, c.renderer, None if opts is None else tuple(Opt(OptOps[o.op], o.axis, o.arg) for o in opts))


def compile_ast(ast, renderer, opts: tuple | None):
    """The kernel compiled with these tinygrad opts (None: its own heuristics or opts), or the refusal."""
    from tinygrad.codegen.opt import KernelOptError
    from tinygrad.engine import realize
    try:
        return realize.to_program(ast if opts is None else with_opts(ast, opts), renderer)
    except KernelOptError as e:
        return f"tinygrad refuses: {e}"
    except RuntimeError as e:   # the device's compiler failed on what tinygrad rendered
        return f"the compile failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"


def compile_workers(device: str) -> int:
    """Processes that compile beside the one that times, as tinygrad's BEAM has them (its PARALLEL, by default
    every core on a GPU and none on the CPU, where compiling would share the cores the kernels run on)."""
    import os

    from tinygrad.helpers import getenv
    return max(0, getenv("PARALLEL", (os.cpu_count() or 1) if device in {"CUDA", "AMD", "NV", "METAL", "HIP"} else 0))


def _compile_job(job: tuple):
    """compile_ast in a compile pool's process: (ast, renderer, opts) -> the program or the refusal."""
    return compile_ast(*job)


@contextlib.contextmanager
def compile_pool(workers: int):
    """`workers` processes that compile kernels (none: None), as tinygrad's BEAM starts its own (spawned, no
    device opened, Ctrl-C left to this process); ended on the way out, whatever they still hold."""
    if workers < 1:
        yield None
        return
    import multiprocessing

    from tinygrad.codegen.opt.search import _init_worker
    pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


def compiled_in_order(jobs: list[tuple], pool) -> Iterator:
    """Each (ast, renderer, opts) job's program or refusal (compile_ast), in the jobs' order: compiled ahead
    by the pool's processes while the caller works on the earlier ones, or here one at a time as asked for."""
    return pool.imap(_compile_job, jobs) if pool is not None else (compile_ast(*job) for job in jobs)


def time_program(c: Captured, prg, reps: int) -> list[float] | str:
    """The program alone on the device, reps times (µs), on scratch buffers of the kernel's sizes (time_ast)."""
    return time_ast(c.ast, c.renderer, prg, reps)


def scratch_buffers(ast, device: str, fill: Callable[[int], bytes] | None = None) -> list:
    """Buffers of the kernel's sizes on the device, filled by `fill` (given their size) where it is given."""
    from tinygrad.codegen.opt.postrange import bufs_from_ast
    bufs = [b.ensure_allocated() for b in bufs_from_ast(ast, device)]
    for b in bufs if fill else ():
        b.copyin(memoryview(bytearray(fill(b.nbytes))))
    return bufs


def time_ast(ast, renderer, prg, reps: int, bufs: list | None = None) -> list[float] | str:
    """The program of `ast` alone on the device, reps times (µs), on scratch buffers of the kernel's sizes
    (`bufs`, from scratch_buffers, where they are given), the caches emptied before each run where the
    device can (as tinygrad's BEAM times); or why it failed."""
    from tinygrad import Device
    from tinygrad.codegen.opt.search import _time_program
    device = renderer.target.device
    bufs = scratch_buffers(ast, device) if bufs is None else bufs
    try:
        tms = _time_program(prg, _mid_vals(ast), bufs, allow_test_size=False, cnt=reps,
                            clear_l2=hasattr(Device[device], "invalidate_caches"))
    except RuntimeError as e:   # e.g. a launch asking for more resources than a multiprocessor has
        return f"the launch failed: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
    return [t * 1e6 for t in tms if math.isfinite(t)] or "the launch failed"
