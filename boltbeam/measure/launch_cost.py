"""Launch and synchronization cost of this device through tinygrad: a measured fact for the account.

A decode token is one JIT replay: the host prepares it, launches its graphs, and waits for the one
value it reads back. The time the token spends outside its device span (before the first kernel
starts and after the last one ends) is that launch and synchronization. Here it is measured on
programs that do nothing else: a JIT of a chain of trivial kernels, each reading a bound variable
as decode kernels read their position, called the way decode calls it (one token in, one value
read back). Several chain lengths give a line: the cost of a call, and of each kernel it launches
(tinygrad batches a JIT's kernels into graphs of 32, 64, 128, ... kernels, so a token of N kernels
launches what a chain of N does). The kernels are timed exactly as `profile` times them, so the
span is the same measurement in both places.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from boltbeam.errors import BadInput

CHAINS = (8, 64, 256, 640)      # kernels per call: one graph, and up to five


@dataclass
class LaunchSample:
    kernels: int               # kernels per call, as recorded
    graphs: int                # graphs launched per call
    outside_us: list[float]    # per call: wall minus the device span of its kernels


@dataclass
class LaunchCost:
    timing: str
    per_call_us: float         # outside the device span per JIT replay, whatever it launches
    per_kernel_us: float       # and per kernel it launches (0 when the line does not rise)
    samples: list[LaunchSample]


def measure_launch_cost(device: str, calls: int = 40, warmup: int = 3) -> LaunchCost:
    """Run both chains and fit the two facts. `device` must already be tinygrad's DEV."""
    from boltbeam.measure.graph_timing import Cupti
    from boltbeam.measure.tinygrad_run import Recorder, default_timing
    if calls < 3:
        raise BadInput("the launch benchmark needs at least 3 calls per chain")
    timing = default_timing(device)
    rec = Recorder(device, timing)
    cupti = Cupti() if timing == "cupti" else None
    with rec.install():
        samples = [_chain(rec, n, calls, warmup, cupti) for n in CHAINS]
    xs, ys = [s.kernels for s in samples], [statistics.median(s.outside_us) for s in samples]
    slope, intercept = np.polyfit(xs, ys, 1)
    if slope <= 0 or intercept <= 0:   # no rise with the kernel count: one cost per call
        slope, intercept = 0.0, statistics.median(ys)
    return LaunchCost(timing, per_call_us=float(intercept), per_kernel_us=float(slope), samples=samples)


def _chain(rec, n: int, calls: int, warmup: int, cupti) -> LaunchSample:
    from tinygrad import Context, Tensor, TinyJit, UOp, dtypes

    from boltbeam.measure.graph_timing import split_by_token
    from boltbeam.measure.tinygrad_run import cupti_timeline, hcq_timeline
    pos = UOp.variable("pos", 0, 1 << 16)
    table = Tensor.arange(1 << 16, dtype=dtypes.int32).contiguous().realize()

    def step(token: Tensor, p) -> Tensor:
        x = token
        for _ in range(n):
            x = (x + table[p]).realize()      # reads the position, as decode's kernels do
        return x

    jit = TinyJit(step)
    token = Tensor([1], dtype=dtypes.int32).contiguous().realize()
    with Context(PROFILE=1) if rec.timing == "hcq" else Context():
        for i in range(warmup):
            token = Tensor([int(jit(token, pos.bind(i)).item()) % 7], dtype=dtypes.int32).contiguous().realize()
        if cupti:
            cupti.start()
        walls, spans, marks, taken = [], [], [], []   # taken: (calls, timeline when read at once)
        for i in range(calls):
            token = Tensor([1 + i % 7], dtype=dtypes.int32).contiguous().realize()
            marks.append(cupti.now_ns() if cupti else time.perf_counter_ns())
            rec.active = True
            t0 = time.perf_counter()
            int(jit(token, pos.bind(warmup + i)).item())
            walls.append((time.perf_counter() - t0) * 1e6)
            rec.active = False
            calls_, _ = rec.take()
            # a graph's timestamps hold only its last replay: read them before the next call
            taken.append((calls_, None if cupti else hcq_timeline(calls_, "launch benchmark")))
    if cupti:
        marks.append(cupti.now_ns())
        per_call = split_by_token(cupti.stop(), marks, "launch benchmark")
        timelines = [cupti_timeline(c, r, "launch benchmark")[0] for (c, _), r in zip(taken, per_call)]
    else:
        timelines = [tl for _, tl in taken]
    for tl in timelines:
        spans.append(max(s + d for _, s, d in tl))
    graphs = {sum(1 for c in calls_ if c[0] == "graph") for calls_, _ in taken}
    kernels = {len(tl) for tl in timelines}
    if len(graphs) != 1 or len(kernels) != 1:
        raise BadInput(f"the launch benchmark's calls differ: graphs {sorted(graphs)}, kernels {sorted(kernels)}")
    return LaunchSample(kernels=kernels.pop(), graphs=graphs.pop(),
                        outside_us=[w - s for w, s in zip(walls, spans)])
