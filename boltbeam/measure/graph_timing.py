"""Kernel times from the graph replay users run, and how each device record finds its kernel.

Two sources, one per kind of tinygrad graph:
  - CUDA graphs: CUPTI activity records (`cupti-python`), enabled after the JIT has captured its
    graphs and flushed once after the measured tokens (a flush per token costs 11-14% of the wall).
    A record names its kernel and launch geometry and says which graph launched it, not which node:
    `match_records` places it by the launch facts captured when the graph was built.
    Beside each token timed so, one timed per launch: CUPTI's graph-level records (each graph's device start
    and end, its nodes not instrumented) and the host's graph-launch calls; the two tokens' device spans
    measure what the per-kernel records cost (`launch_timed`).
  - tinygrad's command-queue graphs (HCQ: the CPU device and others): a graph built with PROFILE=1
    writes a timestamp before and after each of its kernels; `hcq_times` reads them by the kernel's
    place in the graph, so no matching is needed.
"""
from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from boltbeam import switches
from boltbeam.errors import BadInput, Refused

CUPTI_BUFFER_BYTES = 32 << 20   # one buffer holds ~150k kernel records: no callback while tokens run


@dataclass(frozen=True)
class LaunchFacts:
    """What the host asked for, known when the graph was built."""
    name: str                       # the kernel's function name
    grid: tuple[int, int, int]      # groups
    block: tuple[int, int, int]     # threads per group


@dataclass(frozen=True)
class KernelRecord:
    """One kernel execution as the device's profiler saw it."""
    facts: LaunchFacts
    graph_id: int                   # 0: launched outside any graph
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class GraphRecord:
    """One graph's execution as CUPTI's graph-level activity saw it: its first node's start to its last
    node's end, no node instrumented."""
    graph_id: int
    correlation: int                # the launch call's correlation id
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class LaunchCall:
    """One graph launch call as the host made it (CUPTI's driver or runtime API record)."""
    correlation: int
    start_ns: int


@dataclass
class Records:
    """What CUPTI recorded over the measured tokens, kind by kind."""
    kernels: list[KernelRecord]
    graphs: list[GraphRecord]
    calls: list[LaunchCall]


@dataclass(frozen=True)
class LaunchTimed:
    """One token timed per launch: on the timing's clock, from its start mark (before the decode step) to its
    end mark (after the token was read back)."""
    wall_us: float
    span_us: float              # the first launch's device start to the last launch's device end
    host_us: float | None       # start mark to the first launch call (None where no call was recorded)
    lead_us: float              # start mark to the first launch's device start
    trail_us: float             # the last launch's device end to the end mark


def launch_timed(marks_ns: tuple[int, int], wall_us: float, graphs: list[GraphRecord], calls: list[LaunchCall],
                 launches: int | None, where: str) -> LaunchTimed:
    """A token timed per launch from its graph records and launch calls; `launches`: the graphs the host
    launched in it, where the caller knows (a count that differs is refused, never guessed past)."""
    if not graphs or (launches is not None and len(graphs) != launches):
        raise Refused(f"adapter-incomplete: {where}: CUPTI recorded {len(graphs)} graph execution(s) in a token timed "
                      f"per launch" + (f"; the host launched {launches}" if launches is not None else ""))
    if any(g.start_ns == 0 and g.end_ns == 0 for g in graphs):
        raise Refused(f"adapter-incomplete: {where}: CUPTI could not time a graph's execution (start and end 0)")
    first, last = min(g.start_ns for g in graphs), max(g.end_ns for g in graphs)
    ours = {g.correlation for g in graphs}
    called = [c.start_ns for c in calls if c.correlation in ours]
    return LaunchTimed(wall_us, (last - first) / 1e3, (min(called) - marks_ns[0]) / 1e3 if called else None,
                       (first - marks_ns[0]) / 1e3, (marks_ns[1] - last) / 1e3)


def launch_fields(launched: list[LaunchTimed]) -> dict[str, list[float] | None]:
    """The tokens timed per launch as a trace's kernel pass keeps them (trace.KernelPass; none: no fields)."""
    if not launched:
        return {}
    hosts = [t.host_us for t in launched]
    return {"launch_wall_us": [t.wall_us for t in launched], "launch_span_us": [t.span_us for t in launched],
            "launch_host_us": hosts if None not in hosts else None,
            "launch_lead_us": [t.lead_us for t in launched], "launch_trail_us": [t.trail_us for t in launched]}


@dataclass(frozen=True)
class Segment:
    """One host launch of a token, in launch order: a whole graph, or one kernel outside a graph."""
    in_graph: bool
    kernels: list[LaunchFacts]


def dims3(xs) -> tuple[int, int, int]:
    xs = [int(x) for x in (xs or ())]
    return tuple(xs + [1] * (3 - len(xs)))[:3]


def match_records(segments: list[Segment], records: list[KernelRecord], where: str) -> list[list[KernelRecord]]:
    """Each segment's kernels, in node order, paired with the record that timed them.

    Graphs launch one after another on one stream, so a token's records, grouped by graph and
    ordered by their first start, line up with its segments. Inside a graph, kernels with the same
    launch facts are taken in start order: the same kernel repeated (layer after layer) runs in
    dependency order. Any disagreement in count, kind or facts is refused, never guessed past."""
    groups: dict[Any, list[KernelRecord]] = defaultdict(list)
    for i, r in enumerate(records):
        groups[r.graph_id if r.graph_id else ("outside", i)].append(r)
    ordered = sorted(groups.values(), key=lambda g: min(r.start_ns for r in g))
    if len(ordered) != len(segments):
        raise Refused(f"adapter-incomplete: {where}: the device recorded {len(ordered)} launches (graphs and single "
                      f"kernels), the host made {len(segments)}")
    out = []
    for n, (seg, group) in enumerate(zip(segments, ordered)):
        if seg.in_graph != bool(group[0].graph_id):
            raise Refused(f"adapter-incomplete: {where}: launch {n} is {'a graph' if seg.in_graph else 'a single kernel'} "
                          f"on the host but not on the device")
        by_facts: dict[LaunchFacts, list[KernelRecord]] = defaultdict(list)
        for r in sorted(group, key=lambda r: r.start_ns):
            by_facts[r.facts].append(r)
        wanted: dict[LaunchFacts, int] = defaultdict(int)
        for f in seg.kernels:
            wanted[f] += 1
        for f in [*wanted, *(f for f in by_facts if f not in wanted)]:   # the host's kernels first, in node order
            if wanted[f] != len(by_facts.get(f, [])):
                raise Refused(f"adapter-incomplete: {where}: launch {n} holds {wanted[f]} kernel(s) {f.name} grid "
                              f"{f.grid} block {f.block}; the device recorded {len(by_facts.get(f, []))}")
        taken: dict[LaunchFacts, int] = defaultdict(int)
        paired = []
        for f in seg.kernels:
            paired.append(by_facts[f][taken[f]])
            taken[f] += 1
        out.append(paired)
    return out


def split_by_token(records: list, marks_ns: list[int], where: str) -> list[list]:
    """Records (anything with a start_ns) per token, a token running from one host mark to the next
    (len(marks) - 1 tokens)."""
    tokens: list[list] = [[] for _ in marks_ns[:-1]]
    stray = 0
    for r in records:
        i = next((t for t in range(len(tokens)) if marks_ns[t] <= r.start_ns < marks_ns[t + 1]), None)
        if i is None:
            stray += 1
        else:
            tokens[i].append(r)
    if stray:
        raise Refused(f"adapter-incomplete: {where}: {stray} record(s) started outside every measured token")
    return tokens


def alternate(records: Records, marks: list[tuple[int, int]], where: str) -> tuple[list, list, list]:
    """Tokens timed per kernel and per launch, one after the other (a kernel-timed token first): each kind's
    records per token of that kind; a record of one kind in a token of the other is refused (the activity
    did not switch)."""
    bounds = [m[0] for m in marks] + [marks[-1][1] + 1]
    kernels, graphs, calls = (split_by_token(rs, bounds, where) for rs in (records.kernels, records.graphs, records.calls))
    if any(kernels[1::2]) or any(graphs[0::2]):
        raise Refused(f"adapter-incomplete: {where}: CUPTI recorded kernels in a token timed per launch, or graph "
                      f"executions in one timed per kernel: its activity did not switch with the tokens")
    return kernels[0::2], graphs[1::2], calls[1::2]


class Cupti:
    """CUPTI's activity: per kernel (concurrent-kernel records) or per launch (graph records and the graph-launch
    calls), switched token by token; marks on its clock; flushed once."""
    def __init__(self):
        # Checked now, imported only when tracing starts: the model loads before CUPTI is in the process.
        if importlib.util.find_spec("cupti") is None:
            raise BadInput("in-graph timing on CUDA needs cupti-python matching the driver (pip install "
                           "'boltbeam[cuda]'), or --timing launch to time kernels one by one")
        self.cupti, self.records, self.mode = None, Records([], [], []), None

    def start(self) -> None:
        from importlib.metadata import version
        try:
            from cupti import cupti
        except (ImportError, OSError) as e:   # the wheel's libcupti does not load against this driver
            raise Refused(f"cupti-python {version('cupti-python')} does not load here ({e}): install the release "
                          f"that matches the CUDA driver") from None
        self.cupti = cupti

        def requested():
            return CUPTI_BUFFER_BYTES, 0

        kind = cupti.ActivityKind

        def completed(activities):
            got = self.records
            for a in activities:
                if a.kind == kind.CONCURRENT_KERNEL:
                    got.kernels.append(KernelRecord(LaunchFacts(a.name, (a.grid_x, a.grid_y, a.grid_z),
                                                                (a.block_x, a.block_y, a.block_z)),
                                                    a.graph_id, a.start, a.end))
                elif a.kind == kind.GRAPH_TRACE:
                    got.graphs.append(GraphRecord(a.graph_id, a.correlation_id, a.start, a.end))
                elif a.kind in (kind.DRIVER, kind.RUNTIME):
                    got.calls.append(LaunchCall(a.correlation_id, a.start))
        try:
            cupti.activity_register_callbacks(requested, completed)
            cupti.activity_enable(kind.CONCURRENT_KERNEL)
            self.mode = "kernel"
        except cupti.cuptiError as e:
            raise Refused(f"cupti-python {version('cupti-python')} cannot trace this driver's kernels ({e}): install "
                          f"the release that matches the CUDA driver") from None

    def _launch_calls(self, on: int) -> None:
        """The graph-launch calls alone of the driver's and the runtime's APIs (each call recorded costs the host)."""
        c = self.cupti
        for cbid in (c.driver_api_trace_cbid.cuGraphLaunch, c.driver_api_trace_cbid.cuGraphLaunch_ptsz):
            c.activity_enable_driver_api(cbid, on)
        for cbid in (c.runtime_api_trace_cbid.cudaGraphLaunch_v10000,
                     c.runtime_api_trace_cbid.cudaGraphLaunch_ptsz_v10000):
            c.activity_enable_runtime_api(cbid, on)

    def _off(self) -> None:
        kind = self.cupti.ActivityKind
        if self.mode == "kernel":
            self.cupti.activity_disable(kind.CONCURRENT_KERNEL)
        elif self.mode == "launch":
            self.cupti.activity_disable(kind.GRAPH_TRACE)
            self._launch_calls(0)
        self.mode = None

    def per_kernel(self) -> None:
        if self.mode != "kernel":
            self._off()
            self.cupti.activity_enable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
            self.mode = "kernel"

    def per_launch(self) -> str | None:
        """Graph records and launch calls instead of kernel records; a sentence where CUPTI refuses them."""
        if self.mode == "launch":
            return None
        if not per_launch_on():
            return (f"no tokens timed per launch: CUPTI's graph records after its kernel records crashed cuGraphLaunch on "
                    f"an H200 ({switches.CUPTI_PER_LAUNCH.name}=1 turns them on): the timing's cost is not measured on the tokens")
        self._off()
        try:
            self.cupti.activity_enable(self.cupti.ActivityKind.GRAPH_TRACE)
            self.mode = "launch"
            self._launch_calls(1)
        except self.cupti.cuptiError as e:
            self.per_kernel()
            return f"CUPTI cannot time graphs per launch here ({e}): the timing's cost is not measured on the tokens"
        return None

    def now_ns(self) -> int:
        return self.cupti.get_timestamp()

    def stop(self) -> Records:
        self.cupti.activity_flush_all(1)
        self._off()
        records, self.records = self.records, Records([], [], [])
        return records


def per_launch_on() -> bool:
    """Tokens timed per launch are opt-in: on an H200 (driver 580.159.04, cupti-python 13.0.1, 2026-12-05) the first
    graph launch after CUPTI switched from kernel records to graph records crashed inside cuGraphLaunch. Until a way
    that does not crash is measured there, the timing's cost and llama.cpp's launch lines are not measured on the
    token on CUDA, and the account says so."""
    return switches.CUPTI_PER_LAUNCH.value == "1"


def hcq_times(graph) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of each call of a tinygrad HCQ graph built with PROFILE=1, by its place in
    the graph, from its last replay."""
    if not getattr(graph, "prof_graph_entries", None):
        raise Refused("adapter-incomplete: a command-queue graph ran without timestamps (built without PROFILE=1)")
    stamps = [int(s.timestamp * 1000) for s in graph.prof_signals]     # tinygrad's µs -> ns
    return [(stamps[e.st_id], stamps[e.en_id]) for e in graph.prof_graph_entries]
