"""Kernel times from the graph replay users run, and how each device record finds its kernel.

Two sources, one per kind of tinygrad graph:
  - CUDA graphs: CUPTI activity records (`cupti-python`), enabled after the JIT has captured its
    graphs and flushed once after the measured tokens (a flush per token costs 11-14% of the wall).
    A record names its kernel and launch geometry and says which graph launched it, not which node:
    `match_records` places it by the launch facts captured when the graph was built.
  - tinygrad's command-queue graphs (HCQ: the CPU device and others): a graph built with PROFILE=1
    writes a timestamp before and after each of its kernels; `hcq_times` reads them by the kernel's
    place in the graph, so no matching is needed.
"""
from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

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


def split_by_token(records: list[KernelRecord], marks_ns: list[int], where: str) -> list[list[KernelRecord]]:
    """Records per token, a token running from one host mark to the next (len(marks) - 1 tokens)."""
    tokens: list[list[KernelRecord]] = [[] for _ in marks_ns[:-1]]
    stray = 0
    for r in records:
        i = next((t for t in range(len(tokens)) if marks_ns[t] <= r.start_ns < marks_ns[t + 1]), None)
        if i is None:
            stray += 1
        else:
            tokens[i].append(r)
    if stray:
        raise Refused(f"adapter-incomplete: {where}: {stray} kernel record(s) started outside every measured token")
    return tokens


class Cupti:
    """CUPTI's concurrent-kernel activity: enable, mark tokens on its clock, flush once."""
    def __init__(self):
        # Checked now, imported only when tracing starts: the model loads before CUPTI is in the process.
        if importlib.util.find_spec("cupti") is None:
            raise BadInput("in-graph timing on CUDA needs cupti-python matching the driver (pip install "
                           "'boltbeam[cuda]'), or --timing launch to time kernels one by one")
        self.cupti, self.records = None, []

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

        def completed(activities):
            for a in activities:
                if a.kind == cupti.ActivityKind.CONCURRENT_KERNEL:
                    self.records.append(KernelRecord(LaunchFacts(a.name, (a.grid_x, a.grid_y, a.grid_z),
                                                                 (a.block_x, a.block_y, a.block_z)),
                                                     a.graph_id, a.start, a.end))
        try:
            cupti.activity_register_callbacks(requested, completed)
            cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
        except cupti.cuptiError as e:
            raise Refused(f"cupti-python {version('cupti-python')} cannot trace this driver's kernels ({e}): install "
                          f"the release that matches the CUDA driver") from None

    def now_ns(self) -> int:
        return self.cupti.get_timestamp()

    def stop(self) -> list[KernelRecord]:
        self.cupti.activity_flush_all(1)
        self.cupti.activity_disable(self.cupti.ActivityKind.CONCURRENT_KERNEL)
        records, self.records = self.records, []
        return records


def hcq_times(graph) -> list[tuple[int, int]]:
    """(start_ns, end_ns) of each call of a tinygrad HCQ graph built with PROFILE=1, by its place in
    the graph, from its last replay."""
    if not getattr(graph, "prof_graph_entries", None):
        raise Refused("adapter-incomplete: a command-queue graph ran without timestamps (built without PROFILE=1)")
    stamps = [int(s.timestamp * 1000) for s in graph.prof_signals]     # tinygrad's µs -> ns
    return [(stamps[e.st_id], stamps[e.en_id]) for e in graph.prof_graph_entries]
