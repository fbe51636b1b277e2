"""The tie-out: one decode token's wall time split into measured lines that add up to it.

Which figures are independent measurements, and where each comes from:

  wall            the plain tokens: the route as users run it, nothing recording
  kernels         each kernel's time on the device timeline of the timed tokens (in the graph replay
                  itself where the trace says its timing is in-graph: CUPTI or tinygrad's timestamps)
  gaps, overlap   the same device timeline: idle time between kernels, kernels running together; the
                  idle time where one host launch (a graph) ends and the next begins, where the
                  kernels carry their launch, split out as the device waiting on the host
  timing's cost   on CUDA, each timed token beside one timed per launch (CUPTI's graph records, its
                  per-kernel activity off): the timed tokens' device span less theirs, what
                  recording each kernel added (said a kernel too: a check on it). Elsewhere brackets
                  before each token's first kernel launch and after its last, in the plain tokens
                  and in the timed ones (CUDA events, or the device's own stamps on tinygrad's
                  command-queue devices such as the CPU): what the timing added to the device time.
                  Taken back out of the timed kernels' span; counted with launch and sync measured
                  on the token, or with launch facts measured the same way (launch_cost.BRACKETED)
  launch and sync measured on the token where the trace has the host's marks: the plain tokens' host
                  time from their start to their first kernel launch (host clock; where the engine
                  shows no plain launch, llama.cpp, the tokens timed per launch: the first graph-launch
                  call CUPTI saw), then the first launch to the first kernel and the last kernel to
                  the token's return, on the timing's clock: in the tokens timed per launch where the
                  trace has them (recording every kernel also slows the host's launch and sync), else
                  in the timed tokens beside their brackets. Elsewhere, measured facts of the target
                  (`measure-target --launch`: on calibration decodes of other models, the plain token minus the
                  timed kernels' device span (less the timing's cost, where bracketed), per call
                  and per kernel) times the JIT calls and kernels the token launched; only for the
                  engine they were measured through (another engine's trace has no such line)
  floor           the bound (bytes / bandwidth, or operations / peak rate): no measurement at all

Every figure is a mean over the same tokens (trace.kept_pairs): each timed token is paired with the
plain token of the same index (run beside it where the timing interleaves them); the quarter of
pairs whose plain-minus-timed difference is lowest and the quarter where it is highest are dropped
(a machine that changed speed within a pair). Means add up, so the lines' sum is the sum of each
kept token's lines. Medians taken line by line do not add up when a token's time jumps between two
speeds (a shared CPU): there they left accounts off by up to 9%. Every floor of the bound is counted once in the floor line and taken back out once, in the line that holds
the measured time it bounds:

  floor                      sum of the bound's floors (weight roles, KV cache, activations)
  role lines                 a weight role's kernels minus its floor, with the cause of the gap
  activations                minus its floor: inputs and outputs move inside the weight kernels
  boundaries                 kernels that read no weights, one line per category; attention
                             minus the KV cache's floor
  gaps, overlap              from the device timeline
  timing's cost              minus the brackets' timed-minus-plain difference
  launch and sync            three lines measured on the token (host before the first launch, first
                             launch to first kernel, synchronization and read-back), or the target's
                             measured fact times the token's launches

No line is the difference of two totals, so the residual (the wall minus every line) can come out
wrong: over 1% of the wall the account is refused, and the refusal names the measurement that
disagrees (the tokens timed per launch, or the timed tokens less their timing's cost, against the plain
ones; the plain tokens' time outside their brackets against the launch and sync the lines count; the
launch fact against the time the timed tokens spent outside their device span).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import Any, Iterable

from boltbeam.bound.roofline import Bound, formats
from boltbeam.bound.roofline import Line as BoundLine
from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.measure.launch_cost import BRACKETED
from boltbeam.measure.route import LAYOUT_LABEL
from boltbeam.measure.trace import IN_GRAPH, TIMINGS, Kernel, Trace, timeline
from boltbeam.read.roles import read_kind
from boltbeam.units import fmt_bytes

CLOSE_FRACTION = 0.01      # an account closes when |residual| <= 1% of the wall
INFLATION_FRACTION = 0.01  # kernels busy past 101% of the plain token, less their timing's measured cost, were inflated
EXTRA_BYTES_FRACTION = 1.05
LOAD_BYTES = 16            # bytes one thread has in flight per request: one wide (128-bit) load
RESIDENT_FACT = "max_threads_per_multiprocessor"
LAUNCH_FACTS = ("launch_sync_per_call", "launch_sync_per_kernel")   # seconds, measured by measure-target --launch
NON_WEIGHT_FLOORS = ("kv_cache", "activations")   # bound lines that are no weight role
METHOD = "mean over the middle half of plain/timed token pairs"

# Cause of each category of kernel that reads no weights: needed work is named for itself; a
# launch, copy or conversion that need not exist is a "boundary".
BOUNDARY_CAUSES = {"attention": "attention", "kv_write": "kv", "rope": "rope", "sampling": "sampling",
                   "norm": "norm", "weights": "unattributed", "constant": "constant", "copy": "boundary",
                   "elementwise": "boundary", "other": "boundary"}


@dataclass
class Line:
    label: str
    kind: str          # floor, role, boundary, gap, overlap, timing, launch
    us: float
    cause: str
    detail: str
    role: str | None = None
    measured_us: float | None = None
    floor_us: float | None = None
    kernels: int | None = None              # kernels per token behind the line
    causes: list[str] = field(default_factory=list)   # every cause that applies, primary first
    stacked: tuple[str, ...] = ()           # the roles one line holds when a stacked product reads them together
    moved_bytes: float | None = None        # attention: the bytes its kernels moved a token (the compiler's count)


@dataclass
class Account:
    wall_us: float             # mean plain token (of the pairs kept): the route as users run it
    floor_us: float
    lines: list[Line]
    kernel_sum_us: float       # per token, the summed kernel durations
    kernel_pass_wall_us: float | None   # the timed token (a check on the timing, never a line)
    tokens_used: int
    target: str
    context: int
    load_bytes: int
    timing: str | None         # how the kernels were timed: a key of trace.TIMINGS
    overlap_us: float = 0.0    # per token, the time kernels ran at the same time
    outside_span_us: float | None = None   # per timed token: its wall minus its device span (a check)
    lead_us: float | None = None     # per timed token: host mark to first kernel start (a check)
    trail_us: float | None = None    # per timed token: last kernel end to host mark (a check)
    launch_wall_us: float | None = None    # the tokens timed per launch, beside the timed ones (a check)
    timing_cost_us: float | None = None    # what the timing added to the device time, a token (a check on its line)
    kernels_per_token: float | None = None     # kernels a timed token ran: the timing's cost is said a kernel
    plain_outside_us: float | None = None  # per plain token: its wall less its host time and its bracket (a check)
    counted_outside_us: float | None = None    # what the lines count for it: launch to kernel, sync, less the
                                               # timed tokens' own time inside their brackets outside their kernels
    notes: list[str] = field(default_factory=list)
    method: str = METHOD

    @property
    def residual_us(self) -> float:
        return self.wall_us - sum(line.us for line in self.lines)

    @property
    def closed(self) -> bool:
        return abs(self.residual_us) <= CLOSE_FRACTION * self.wall_us

    @property
    def busy_us(self) -> float:
        """Device time the kernels occupy: their sum less the time they ran at the same time."""
        return self.kernel_sum_us - self.overlap_us

    @property
    def inflation_us(self) -> float:
        """How far the kernels' busy time, less what their timing measurably added, exceeds the plain token (0
        when it fits)."""
        return max(0.0, self.busy_us - (self.timing_cost_us or 0.0) - self.wall_us)

    @property
    def timing_cost_per_kernel_us(self) -> float | None:
        """The timing's cost a kernel: the figure to hold against CUPTI's known 0.5-0.7 µs on an H200."""
        return self.timing_cost_us / self.kernels_per_token if self.timing_cost_us is not None and \
            self.kernels_per_token else None

    @property
    def refusals(self) -> list[str]:
        reasons = []
        if not self.closed:
            r = self.residual_us
            reasons.append(f"the account does not close: residual {r:+,.2f} µs is {abs(r) / self.wall_us:.1%} "
                           f"of the {self.wall_us:,.2f} µs token (closing needs <= {CLOSE_FRACTION:.0%}); "
                           + self.disagreement)
        if self.inflation_us > INFLATION_FRACTION * self.wall_us:
            less = f" ({self.timing_cost_us:,.2f} µs of it the timing's measured cost)" if self.timing_cost_us else ""
            reasons.append(f"per-kernel timing inflated the kernels: they occupy {self.busy_us:,.2f} µs{less}, "
                           f"{self.inflation_us:,.2f} µs ({self.inflation_us / self.wall_us:.1%}) more than the "
                           f"{self.wall_us:,.2f} µs plain token; time them on one device timeline, "
                           f"synchronized once per token")
        return reasons

    @property
    def disagreement(self) -> str:
        """Which measurement disagrees with the wall, judged from the checks the trace carries."""
        said = []
        off = lambda x: abs(x - self.wall_us) > CLOSE_FRACTION * self.wall_us
        timed, beside = self.kernel_pass_wall_us, self.launch_wall_us
        if beside is not None:
            if off(beside):
                said.append(f"the tokens timed per launch took {beside:,.2f} µs against {self.wall_us:,.2f} µs plain "
                            f"({beside / self.wall_us - 1:+.1%}): CUPTI's graph records changed the token")
        elif timed is not None and self.timing_cost_us is not None:
            if off(net := timed - self.timing_cost_us):
                said.append(f"the timed tokens less their timing's cost took {net:,.2f} µs against {self.wall_us:,.2f} "
                            f"µs plain ({net / self.wall_us - 1:+.1%}): the machine ran them at another speed")
        elif timed is not None and off(timed):
            said.append(f"the timed tokens took {timed:,.2f} µs against {self.wall_us:,.2f} µs plain "
                        f"({timed / self.wall_us - 1:+.1%}): timing the kernels changed the token")
        if self.plain_outside_us is not None and self.counted_outside_us is not None and \
                abs(self.plain_outside_us - self.counted_outside_us) > CLOSE_FRACTION * self.wall_us:
            said.append(f"the plain tokens spent {self.plain_outside_us:,.2f} µs from their first launch to their device "
                        f"time's start and from its end to their return; the timed tokens' launch and sync count "
                        f"{self.counted_outside_us:,.2f} µs for it")
        launch_lines = [line.us for line in self.lines if line.kind == "launch"]
        launch = sum(launch_lines) if launch_lines else None
        which = "the tokens timed per launch" if self.launch_wall_us is not None else "the timed tokens"
        if self.outside_span_us is not None:
            if launch is None:
                said.append(f"{which} spent {self.outside_span_us:,.2f} µs outside their device span and "
                            f"no launch fact counts it")
            elif abs(self.outside_span_us - launch) > CLOSE_FRACTION * self.wall_us:
                where = (f" ({self.lead_us:,.2f} µs before the first kernel, {self.trail_us:,.2f} µs after the last)"
                         if self.lead_us is not None and self.trail_us is not None and self.launch_wall_us is None
                         else "")
                said.append(f"launch and sync count {launch:,.2f} µs; {which} spent "
                            f"{self.outside_span_us:,.2f} µs outside their device span{where}")
        if self.timing and self.timing not in IN_GRAPH:
            said.append(f"the kernels were timed {TIMINGS[self.timing].split(':')[0]}")
        return "; ".join(said) or "no single measurement stands out: the lines disagree with the wall"

    def to_dict(self) -> dict[str, Any]:
        return {"wall_us": self.wall_us, "floor_us": self.floor_us,
                "lines": [asdict(line) for line in self.lines],
                "residual_us": self.residual_us, "closed": self.closed,
                "residual_fraction": self.residual_us / self.wall_us,
                "kernel_sum_us": self.kernel_sum_us, "overlap_us": self.overlap_us, "busy_us": self.busy_us,
                "kernel_pass_wall_us": self.kernel_pass_wall_us, "outside_span_us": self.outside_span_us,
                "lead_us": self.lead_us, "trail_us": self.trail_us, "launch_wall_us": self.launch_wall_us,
                "timing_cost_us": self.timing_cost_us, "timing_cost_per_kernel_us": self.timing_cost_per_kernel_us,
                "plain_outside_us": self.plain_outside_us, "counted_outside_us": self.counted_outside_us,
                "timing": self.timing, "inflation_us": self.inflation_us, "tokens_used": self.tokens_used, "method": self.method,
                "target": self.target, "context": self.context, "load_bytes_per_thread": self.load_bytes,
                "refusals": self.refusals, "notes": self.notes}


# --- kernels, grouped ------------------------------------------------------------------------

def role_of(k: Kernel) -> str | None:
    """The weight role a kernel's time counts toward: a weight kernel's role, or a norm's."""
    return k.role if k.role and k.category in ("weights", "norm") else None


def _mean_of(per_token: Iterable[dict[str, float]], key: str) -> float:
    return fmean(d.get(key, 0.0) for d in per_token)


@dataclass
class Tokens:
    """The measured tokens an account uses, index by index: plain walls, timed walls (when the trace has
    one per timed token) and each timed token's kernels; lead and trail where the trace has them."""
    walls: list[float]
    pass_walls: list[float]
    groups: dict[int, list[Kernel]]
    lead: list[float]
    trail: list[float]
    timing_cost: list[float] = field(default_factory=list)   # per token: what its timing added (trace.timing_cost_us)
    plain_host: list[float] = field(default_factory=list)    # per plain token: start to first launch
    timed_host: list[float] = field(default_factory=list)    # per timed token: the same
    plain_bracket: list[float] = field(default_factory=list)
    timed_bracket: list[float] = field(default_factory=list)
    launched: dict[str, list[float]] = field(default_factory=dict)   # the tokens timed per launch: KernelPass's
                                                                     # launch_* lists, by the name after launch_


LAUNCHED = ("wall", "span", "host", "lead", "trail")     # KernelPass.launch_<name>_us


def paired_tokens(trace: Trace) -> Tokens:
    """The tokens of trace.kept_pairs (every token when the trace cannot pair them)."""
    groups = trace.by_token()
    kp = trace.kernel_pass
    lead, trail = list((kp and kp.lead_us) or []), list((kp and kp.trail_us) or [])
    cost = trace.timing_cost_us() or []
    lists = [list(getattr(kp, name, None) or []) for name in
             ("plain_host_us", "timed_host_us", "plain_bracket_us", "timed_bracket_us")]
    launched = {name: list(xs) for name in LAUNCHED if (xs := getattr(kp, f"launch_{name}_us", None))}
    kept = trace.kept_pairs()
    if kept is None:
        return Tokens(list(trace.token_wall_us), list(trace.kernel_pass_wall_us), groups, lead, trail, cost, *lists,
                      launched)
    pick = lambda xs: [xs[i] for i in kept] if len(xs) >= len(groups) else xs
    return Tokens([trace.token_wall_us[i] for i in kept], [trace.kernel_pass_wall_us[i] for i in kept],
                  {i: groups[i] for i in kept}, pick(lead), pick(trail), pick(cost), *map(pick, lists),
                  {name: pick(xs) for name, xs in launched.items()})


# --- causes of a role's gap ----------------------------------------------------------------------

def _us(x: float) -> str:
    return f"{x:,.1f} µs" if abs(x) >= 10 else f"{x:.3g} µs"


def _rate(bytes_per_s: float) -> str:
    return f"{fmt_bytes(bytes_per_s)}/s"


def _prod(xs: list[int] | None) -> int:
    return math.prod(xs) if xs else 1


def launched_threads(global_size: list[int] | None, local_size: list[int] | None) -> int:
    """tinygrad's global_size counts groups when a local size is given, threads when it is not."""
    return _prod(global_size) * _prod(local_size) if local_size else _prod(global_size)


@dataclass
class _Cause:
    name: str
    sentence: str
    explains_us: float   # how much of the gap this cause accounts for, to rank causes


def _starving(kernels: list[Kernel], moved_bytes: float, floor_us: float, gap_us: float, target: Target,
              bandwidth: float, load_bytes: int) -> _Cause | str | None:
    """Little's law on the launch geometry holding most of the role's time: a _Cause when it has
    fewer bytes in flight than the memory needs, None when it has enough, a sentence when it cannot
    be judged (among them: the role ran faster than the bytes assumed in flight a thread allow)."""
    latency = target.fact("memory_latency")
    if latency is None:
        return "the target lacks memory_latency: Little's law not applied"
    time_by_shape: dict[tuple, float] = defaultdict(float)
    for k in kernels:
        if k.global_size:
            time_by_shape[(tuple(k.global_size), tuple(k.local_size or ()))] += k.duration_us
    if not time_by_shape:
        return "no launch geometry in the trace: Little's law not applied"
    global_size, local_size = (list(dims) for dims in max(time_by_shape, key=time_by_shape.get))
    threads = launched_threads(global_size, local_size)
    per_sm, sms = target.fact(RESIDENT_FACT), target.fact("multiprocessors")
    resident = int(per_sm * sms) if per_sm and sms else None
    in_flight = min(threads, resident or threads) * load_bytes
    needed = bandwidth * latency
    if in_flight >= needed:
        return None
    launch = (f"{_prod(global_size):,} groups of {_prod(local_size):,} threads = {threads:,} threads"
              if local_size else f"{threads:,} threads (no local size)")
    capped = f", capped at {resident:,} resident" if resident and threads > resident else ""
    launch += capped
    reach = in_flight / latency
    least_us = moved_bytes / reach * 1e6
    if least_us > floor_us + gap_us:    # it ran faster than the assumption allows: the assumption is wrong here
        return (f"Little's law not judged: at {load_bytes} B in flight a thread (one wide load each: assumed) "
                f"{launch} could draw at most {_rate(reach)}, yet it drew {_rate(moved_bytes / (floor_us + gap_us) * 1e6)}"
                f": its threads keep more than one load in flight each")
    sentence = (f"starving: launches {launch}, at most {fmt_bytes(in_flight)} in flight ({load_bytes} B "
                f"per thread, one wide load each: assumed); the memory needs {fmt_bytes(needed)} in flight "
                f"({_rate(bandwidth)} x {latency * 1e9:,.0f} ns), {in_flight / needed:.1%} of it, so it can draw "
                f"at most {_rate(reach)} and needs at least {_us(least_us)}")
    if len(time_by_shape) > 1:
        sentence += f" (the launch shape holding most of its time, of {len(time_by_shape)})"
    return _Cause("starving", sentence, min(gap_us, max(0.0, least_us - floor_us)))


def _unpacking(roles: tuple[str, ...], bound: Bound, measured_us: float, floor_bytes: int, planes: bool,
               load_bytes: int) -> _Cause | None:
    """GGML blocks decoded in place by the roles' own kernels, where the repacked-layout family could
    read them as planes: the block records' facts (gguf's sizes) and the draw the kernels reached."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    formats_here = sorted({t.format for t in bound.tensors if t.role in roles and t.format})
    takes = [f for f in formats_here if "repacked-layout" in formats().get(f, {}).get("routes", [])]
    if planes or not takes or not measured_us:
        return None
    records = []
    for f in takes:
        elements, size = GGML_QUANT_SIZES[GGMLQuantizationType[f]]
        aligned = "" if size % load_bytes == 0 else f", not a whole number of {load_bytes}-byte loads"
        records.append(f"{f} in {size}-byte records of {elements} values with their scales inside{aligned}")
    drawn = floor_bytes / measured_us * 1e6
    return _Cause("unpacking", f"unpacking: its kernels decode the blocks in place ({'; '.join(records)}) and draw "
                               f"{_rate(drawn)} for its floor's bytes, {drawn / bound.bandwidth_bytes_per_s:.1%} of "
                               f"{_rate(bound.bandwidth_bytes_per_s)}; the repacked-layout family reads them as planes "
                               f"(boltbeam profile --layout)", 0.0)


def _causes(floor_line: BoundLine, kernels: list[Kernel], moved_bytes: float | None, gap_us: float,
            target: Target, bandwidth: float, load_bytes: int) -> tuple[list[_Cause], list[str]]:
    """The causes that apply to a role's gap, primary first, and sentences on what could not be judged.
    Rule: compute first when the floor is arithmetic (memory-side causes cannot be the limit);
    otherwise whichever of starving and bytes explains more of the gap."""
    causes: list[_Cause] = []
    unjudged: list[str] = []
    starving = _starving(kernels, moved_bytes or floor_line.bytes, floor_line.floor_us, gap_us, target,
                         bandwidth, load_bytes)
    if isinstance(starving, _Cause):
        causes.append(starving)
    elif starving:
        unjudged.append(starving)
    if moved_bytes is None:
        unjudged.append("the trace gives no byte counts for its kernels: bytes not compared")
    elif moved_bytes > EXTRA_BYTES_FRACTION * floor_line.bytes:
        extra = moved_bytes - floor_line.bytes
        ratio = moved_bytes / floor_line.bytes
        causes.append(_Cause("bytes", f"bytes: moved {moved_bytes:,.0f} B, {extra:,.0f} B ({ratio:.2f}x) more "
                                      f"than the floor's {floor_line.bytes:,} B", min(gap_us, extra / bandwidth * 1e6)))
    causes.sort(key=lambda c: -c.explains_us)
    if floor_line.limit == "compute":
        causes.insert(0, _Cause("compute", f"compute: its arithmetic floor binds on {floor_line.unit} "
                                           f"({floor_line.flops:,} operations: {_us(floor_line.floor_compute_us)} "
                                           f"against {_us(floor_line.floor_memory_us)} for its bytes)", gap_us))
    return causes, unjudged


# --- the account -----------------------------------------------------------------------------------

def account(trace: Trace, bound: Bound, target: Target, load_bytes: int = LOAD_BYTES) -> Account:
    """Tie one decode token out: lines (means over the kept token pairs) that add up to the plain token."""
    if not trace.kernels:
        raise Refused("whole-token figures only: no kernels to account")
    if not trace.token_wall_us:
        raise Refused("the trace has no plain token walls: nothing to tie the kernels out to")
    if bound.batch != 1:
        raise BadInput(f"the account ties out batch-1 decode tokens; the bound is for batch {bound.batch}")
    notes: list[str] = []
    context = trace.workload.context
    if context is None:
        notes.append(f"the trace does not say its context: bounded at context {bound.context}")
    elif context != bound.context:
        notes.append(f"the trace decoded at context {context}; the bound is at context {bound.context}")
    tokens = paired_tokens(trace)
    groups = tokens.groups
    per_token = [_token_sums(kernels) for kernels in groups.values()]
    floor_us = bound.token_floor_us
    floor = Line("floor", "floor", floor_us, "floor",
                 f"the token's floor on {bound.target} at context {bound.context}, batch 1: {bound.bytes_per_step:,} B "
                 f"at {_rate(bound.bandwidth_bytes_per_s)} ({bound.bandwidth_fact}), or a role's arithmetic where "
                 f"that is slower", floor_us=floor_us)
    roles = _role_lines(trace, per_token, bound, target, load_bytes, notes)
    boundaries = _boundary_lines(trace, per_token, bound)
    overheads, overlap, checks = _overhead_lines(trace, tokens, target, notes)
    if roles and target.fact(RESIDENT_FACT) is None:
        notes.append(f"the target lacks {RESIDENT_FACT}: launches are not capped at what can be resident")
    timing = trace.kernel_pass.timing if trace.kernel_pass else None
    if timing and timing not in IN_GRAPH:
        notes.append(f"kernels timed {TIMINGS[timing]}")
    pass_wall = fmean(tokens.pass_walls) if tokens.pass_walls else None
    lead = fmean(tokens.lead) if tokens.lead else None
    trail = fmean(tokens.trail) if tokens.trail else None
    return Account(wall_us=fmean(tokens.walls), floor_us=floor_us, lines=[floor, *roles, *boundaries, *overheads],
                   kernel_sum_us=_mean_of(per_token, "kernels"), kernel_pass_wall_us=pass_wall, overlap_us=overlap,
                   tokens_used=len(groups), target=bound.target, context=bound.context, load_bytes=load_bytes,
                   timing=timing, lead_us=lead, trail_us=trail, notes=notes,
                   kernels_per_token=fmean(len(ks) for ks in groups.values()), **checks)


def _token_sums(kernels: list[Kernel]) -> dict[str, float]:
    """One token's time, kernel count and bytes per role (or per category for kernels with no role)."""
    d: dict[str, float] = defaultdict(float)
    for k in kernels:
        role = role_of(k)
        key = f"role:{role}" if role else f"cat:{k.category}"
        d[key] += k.duration_us
        d[f"n:{key}"] += 1
        d[f"bytes:{key}"] += k.bytes or 0
        d[f"written:{key}"] += k.writes_bytes or 0
        d["kernels"] += k.duration_us
    return d


def stacked_roles(trace: Trace, bound: Bound) -> list[tuple[str, ...]]:
    """The weight roles in the bound's order, in groups: roles whose tables one kernel reads together
    (a stacked product: gate and up in one matrix) share a line, since no kernel times them apart."""
    table_roles = [r.role for r in bound.roles if r.role not in NON_WEIGHT_FLOORS and read_kind(r.role) == "table"]
    role_of_name = {t.name: t.role for t in bound.tensors if t.name and t.role in table_roles}
    group = {r: {r} for r in table_roles}
    for k in trace.kernels:
        read = {role_of_name[n] for n in k.tensors if n in role_of_name} if k.category == "weights" else set()
        if len(read) > 1:
            merged = set().union(*(group[r] for r in read))
            for r in merged:
                group[r] = merged
    out: list[tuple[str, ...]] = []
    for r in [r.role for r in bound.roles if r.role not in NON_WEIGHT_FLOORS]:
        members = tuple(x for x in table_roles if x in group[r]) if r in group else (r,)
        if members not in out:
            out.append(members)
    return out


def merged_line(lines: list[BoundLine]) -> BoundLine:
    """One bound line for roles a stacked product reads together."""
    if len(lines) == 1:
        return lines[0]
    return BoundLine("+".join(line.role for line in lines), sum(line.bytes for line in lines),
                     sum(line.flops for line in lines), lines[0].unit, sum(line.floor_memory_us for line in lines),
                     sum(line.floor_compute_us for line in lines), sum(line.count for line in lines))


def _role_lines(trace: Trace, per_token: list[dict[str, float]], bound: Bound, target: Target, load_bytes: int,
                notes: list[str]) -> list[Line]:
    """Each weight role's time above its floor (roles a stacked product reads together on one line),
    with its causes; biggest gap first."""
    bandwidth = bound.bandwidth_bytes_per_s
    by_role = {r.role: r for r in bound.roles}
    planes = LAYOUT_LABEL in str(trace.route.label or "")     # the weights were read as planes
    kernels_of_role: dict[str, list[Kernel]] = defaultdict(list)
    for k in trace.kernels:
        if role := role_of(k):
            kernels_of_role[role].append(k)
    unknown = sorted(kernels_of_role.keys() - by_role.keys())
    if unknown:
        notes.append(f"role(s) {', '.join(unknown)} are not in the model's census: counted with no floor")
    roles: list[Line] = []
    for members in stacked_roles(trace, bound) + [(u,) for u in unknown]:
        role, stacked = "+".join(members), members if len(members) > 1 else ()
        keys = [f"role:{r}" for r in members]
        measured = sum(_mean_of(per_token, key) for key in keys)
        bl = merged_line([by_role[r] for r in members]) if all(r in by_role for r in members) else None
        role_floor = bl.floor_us if bl else 0.0
        gap = measured - role_floor
        n = round(sum(_mean_of(per_token, f"n:{key}") for key in keys))
        kernels = [k for r in members for k in kernels_of_role[r]]
        head = f"{role}: {n} kernel(s), {_us(measured)} against a floor of {_us(role_floor)}"
        if not kernels:
            roles.append(Line(role, "role", gap, "no kernel",
                              f"{role}: no kernel carries this role (fused into another, or unnamed in the trace): "
                              f"its floor of {_us(role_floor)} is taken back out here",
                              role=role, stacked=stacked, measured_us=measured, floor_us=role_floor, kernels=0))
            continue
        if bl is None:
            roles.append(Line(role, "role", gap, "no floor", f"{head}: the model's census has no such role",
                              role=role, stacked=stacked, measured_us=measured, floor_us=0.0, kernels=n))
            continue
        if gap < 0:
            roles.append(Line(role, "role", gap, "below floor", f"{head}: faster than physics allows; "
                              f"the trace's role labels or the target's bandwidth are wrong",
                              role=role, stacked=stacked, measured_us=measured, floor_us=role_floor, kernels=n))
            continue
        bytes_known = all(k.bytes is not None for k in kernels)
        moved = sum(_mean_of(per_token, f"bytes:{key}") for key in keys) if bytes_known else None
        causes, unjudged = _causes(bl, kernels, moved, gap, target, bandwidth, load_bytes)
        if unpacking := _unpacking(members, bound, measured, bl.bytes, planes, load_bytes):
            causes.append(unpacking)    # explains no measured share of the gap: listed last, primary only alone
        if causes:
            sentences = [c.sentence for c in causes]
        else:
            achieved = bl.bytes / measured * 1e6 if measured else 0.0
            sentences = [f"unexplained: it draws {_rate(achieved)} for its floor's bytes, "
                         f"{achieved / bandwidth:.1%} of {_rate(bandwidth)}"]
        roles.append(Line(role, "role", gap, causes[0].name if causes else "unexplained",
                          "; ".join([f"{head}: {_us(gap)} above it", *sentences, *unjudged]),
                          role=role, stacked=stacked, measured_us=measured, floor_us=role_floor, kernels=n,
                          causes=[c.name for c in causes] or ["unexplained"]))
    if "activations" in by_role:
        act = by_role["activations"]
        roles.append(Line("activations", "role", -act.floor_us, "inside other kernels",
                          f"activations: floor {_us(act.floor_us)} ({act.bytes:,} B of every weight table's input "
                          f"and output); no kernel of its own: they move inside the kernels above, so their floor "
                          f"is taken back out here", role="activations", measured_us=0.0, floor_us=act.floor_us,
                          kernels=0))
    return sorted(roles, key=lambda line: -line.us)


def _boundary_lines(trace: Trace, per_token: list[dict[str, float]], bound: Bound) -> list[Line]:
    """One line per category of kernel that moves no weight; attention is measured against the KV floor."""
    kv = next((r for r in bound.roles if r.role == "kv_cache"), None)
    categories = sorted({k.category for k in trace.kernels if not role_of(k)} | {"attention"},
                        key=list(BOUNDARY_CAUSES).index)
    boundaries: list[Line] = []
    for cat in categories:
        key = f"cat:{cat}"
        measured, n = _mean_of(per_token, key), round(_mean_of(per_token, f"n:{key}"))
        label = "weights (no role)" if cat == "weights" else cat
        if cat == "attention" and kv is not None:
            moved = _mean_of(per_token, f"bytes:{key}")     # (a float32 cache moves twice the float16 the floor counts)
            boundaries.append(Line(label, "boundary", measured - kv.floor_us, "attention",
                                   f"attention: {n} kernel(s), {_us(measured)} against the KV cache's floor of "
                                   f"{_us(kv.floor_us)} ({kv.bytes:,} B read and written at context {bound.context}); "
                                   f"its kernels moved {moved:,.0f} B ({moved / kv.bytes:.2f}x the floor's)",
                                   measured_us=measured, floor_us=kv.floor_us, kernels=n, moved_bytes=moved))
            continue
        if cat == "constant":
            written = _mean_of(per_token, "written:cat:constant")
            boundaries.append(Line(label, "boundary", measured, "constant",
                                   f"constant: {n} kernel(s), {_us(measured)}: a constant recomputed every token: they read "
                                   f"nothing and write {written:,.0f} B (the constants-once family computes it once)",
                                   measured_us=measured, kernels=n))
            continue
        what = {"unattributed": "they read weights but the trace names no role",
                "boundary": "a launch, copy or conversion that need not exist"}.get(BOUNDARY_CAUSES[cat], "needed work")
        boundaries.append(Line(label, "boundary", measured, BOUNDARY_CAUSES[cat],
                               f"{label}: {n} kernel(s), {_us(measured)}: {what}", measured_us=measured, kernels=n))
    return sorted(boundaries, key=lambda line: -line.us)


def _overhead_lines(trace: Trace, tokens: Tokens, target: Target,
                    notes: list[str]) -> tuple[list[Line], float, dict[str, float | None]]:
    """Gaps and overlap from the device timeline; the timing's cost; launch and sync measured on the token, or
    from the target's measured fact. Also the overlap (the inflation check needs it) and the checks, never
    lines: the time the tokens spent outside their device span (the timed ones, or those timed per launch),
    what the timing cost, and the plain tokens' time outside their brackets against what the lines count."""
    groups = tokens.groups
    n = len(groups)
    timelines = [timeline(ks) for ks in groups.values()]
    overheads: list[Line] = []
    overlap = 0.0
    checks: dict[str, float | None] = {}
    if all(t is not None for t in timelines):
        gaps = fmean(t.gaps_us for t in timelines)
        overlap = fmean(t.overlap_us for t in timelines)
        biggest = max(t.biggest_gap_us for t in timelines)
        if all(t.between_launches_us is not None for t in timelines) and any(t.launch_boundaries for t in timelines):
            # the kernels say which host launch (a graph) each ran in: the idle time where one launch ends and
            # the next begins is the device waiting on the host, a line of its own
            between = fmean(t.between_launches_us for t in timelines)
            within = fmean(t.within_launches_us for t in timelines)
            boundaries = max(t.launch_boundaries for t in timelines)
            overheads.append(Line("waits for the next launch", "gap", between, "launch boundary",
                                  f"idle device time where one host launch (a graph, or a kernel alone) ends and the "
                                  f"next begins, at {boundaries} boundar{'y' if boundaries == 1 else 'ies'} a token: "
                                  f"the device waiting while the host prepares and launches the next"))
            overheads.append(Line("gaps between kernels", "gap", within, "gap",
                                  "idle device time between consecutive kernels of one launch"))
        else:
            overheads.append(Line("gaps between kernels", "gap", gaps, "gap", f"idle device time between consecutive "
                                  f"kernels (biggest gap {_us(max(0.0, biggest))})"))
        overheads.append(Line("overlap", "overlap", -overlap, "overlap", "kernels running at the same time"))
        if len(tokens.pass_walls) == n:
            checks["outside_span_us"] = fmean(w - t.span_us for w, t in zip(tokens.pass_walls, timelines))
    else:
        notes.append("some kernels lack start_us: gaps and overlap are not measured")
        timelines = []
    launched = tokens.launched if all(len(tokens.launched.get(k, [])) == n
                                      for k in ("wall", "span", "lead", "trail")) else {}
    if launched:
        checks["launch_wall_us"] = fmean(launched["wall"])
        checks["outside_span_us"] = fmean(w - s for w, s in zip(launched["wall"], launched["span"]))
    facts = [target.facts.get(name) for name in LAUNCH_FACTS]
    bracketed = all(f is not None and f.method == BRACKETED for f in facts)
    cost = None
    if tokens.timing_cost:
        us = checks["timing_cost_us"] = fmean(tokens.timing_cost)
        how = (f"the timed tokens' device span less that of the token timed per launch beside each (CUPTI's graph "
               f"records, no kernel recorded; {len(tokens.timing_cost)} pair(s))" if launched else
               f"the timed tokens' brackets less the plain tokens' (brackets before the first launch and after the "
               f"last, {len(tokens.timing_cost)} pair(s))")
        cost = Line("timing's cost", "timing", -us, "timing",
                    f"{how}: {_us(us)}, {us / fmean(len(ks) for ks in groups.values()):.3g} µs a kernel, what the "
                    f"timing added inside the span, taken back out")
    # Measured on the token where the timing's own cost is measured apart too; elsewhere (older traces) the launch
    # facts, which are net of that cost unless BRACKETED, bridge plain and timed tokens.
    host = (_launched_lines(tokens, launched) if launched else _host_lines(tokens)) if cost else []
    if host:
        overheads += host + [cost]
        if not launched and len(tokens.plain_bracket) == len(tokens.plain_host) == len(tokens.walls) and timelines:
            checks["plain_outside_us"] = fmean(w - h - b for w, h, b in
                                               zip(tokens.walls, tokens.plain_host, tokens.plain_bracket))
            checks["counted_outside_us"] = sum(x.us for x in host[1:]) - fmean(
                b - t.span_us for b, t in zip(tokens.timed_bracket, timelines))
        if fact_line := _launch_line(trace, groups, target, []):
            notes.append(f"launch and sync measured on this token's host ({_us(sum(x.us for x in host))}); the "
                         f"target's launch facts would have counted {_us(fact_line.us)}")
        return overheads, overlap, checks
    if cost and bracketed:
        overheads.append(cost)
    elif tokens.timing_cost:
        notes.append(f"the timing added {_us(fmean(tokens.timing_cost))} to the device time (brackets), but the "
                     f"target's launch facts are net of that cost already: not taken out twice")
    elif bracketed and trace.kernel_pass and trace.kernel_pass.timing == "cupti":
        notes.append("the trace has no brackets around its launches: the timing's cost inside the span, which "
                     "the target's launch facts leave out, is not measured (it lies in the residual)")
    launch = _launch_line(trace, groups, target, notes)
    if launch:
        overheads.append(launch)
    return overheads, overlap, checks


def _launched_lines(tokens: Tokens, launched: dict[str, list[float]]) -> list[Line]:
    """Launch and synchronization measured on the tokens timed per launch (CUPTI's graph records and the host's
    graph-launch calls, on its clock): recording each kernel also slows the host's launch and its wait, so the
    timed tokens' own are checks. The host's time before its first launch from the plain tokens where the
    engine shows it (tinygrad's replay), else from the launch call CUPTI recorded."""
    n = len(launched["wall"])
    called = launched.get("host") if len(launched.get("host", [])) == n else None
    if called is None:
        lines = [Line("before the first kernel", "launch", fmean(launched["lead"]), "launch",
                      f"the tokens timed per launch: their start to their first graph's start on the device, the host's "
                      f"work and the launch together (no launch call recorded; {n} token(s))")]
    else:
        plain = len(tokens.plain_host) == n
        lines = [Line("host before the first launch", "launch", fmean(tokens.plain_host if plain else called), "launch",
                      ("the plain tokens' start to their first kernel launch, on the host" if plain else
                       "the tokens timed per launch: their start to their first graph-launch call (the plain tokens "
                       "show no launch)") + f" ({n} token(s))"),
                 Line("first launch to first kernel", "launch", fmean(a - b for a, b in zip(launched["lead"], called)),
                      "launch", f"the tokens timed per launch: their first launch call to their first graph's start "
                                f"on the device, on the timing's clock ({n} token(s))")]
    return lines + [Line("synchronization and read-back", "launch", fmean(launched["trail"]), "launch",
                         f"the tokens timed per launch: their last graph's end on the device to their return, on the "
                         f"timing's clock ({n} token(s)): waiting for the device and reading the token back")]


def _host_lines(tokens: Tokens) -> list[Line]:
    """Launch and synchronization measured on the token itself, where the trace has the host's marks: the
    host's time before the first launch (the plain tokens), then, in the timed tokens on the timing's
    clock, the first launch to the first kernel and the last kernel to the token's return."""
    n = len(tokens.groups)
    if not (len(tokens.plain_host) == len(tokens.timed_host) == len(tokens.lead) == len(tokens.trail) == n):
        return []
    latency = fmean(lead - host for lead, host in zip(tokens.lead, tokens.timed_host))
    return [Line("host before the first launch", "launch", fmean(tokens.plain_host), "launch",
                 f"the plain tokens' start to their first kernel launch, on the host ({n} token(s)): the decode "
                 f"step and the JIT replay in Python before anything runs on the device"),
            Line("first launch to first kernel", "launch", latency, "launch",
                 f"the timed tokens' first kernel launch to their first kernel's start, on the timing's clock "
                 f"({n} token(s))"),
            Line("synchronization and read-back", "launch", fmean(tokens.trail), "launch",
                 f"the timed tokens' last kernel's end to their return, on the timing's clock ({n} token(s)): "
                 f"waiting for the device and reading the token back")]


def _launch_line(trace: Trace, groups: dict[int, list[Kernel]], target: Target, notes: list[str]) -> Line | None:
    """The target's measured launch and synchronization cost times the launches the token made, for the
    engine it was measured through."""
    facts = [target.facts.get(name) for name in LAUNCH_FACTS]
    if trace.kernel_pass is None:
        notes.append("the trace does not say what the host launched per token: launch and sync are not counted")
        return None
    if None in facts or any(f.status != "measured" for f in facts):
        notes.append(f"the target has no measured {' and '.join(LAUNCH_FACTS)} (boltbeam measure-target --launch): "
                     f"launch and sync are not counted")
        return None
    measured_through = {f.engine for f in facts} - {None}
    if measured_through and (engine := trace.environment.engine) not in measured_through:
        notes.append(f"the target's launch facts were measured through {', '.join(sorted(measured_through))}; this "
                     f"trace ran {engine or 'an unnamed engine'}, whose host launches and synchronizes its own way: "
                     f"launch and sync are not counted (they lie in the residual)")
        return None
    per_call, per_kernel = (f.value * 1e6 for f in facts)
    calls = fmean(trace.kernel_pass.jit_calls)
    kernels = fmean(len(ks) for ks in groups.values())
    graphs = fmean(trace.kernel_pass.graph_launches)
    us = per_call * calls + per_kernel * kernels
    return Line("launch and sync", "launch", us, "launch",
                f"{calls:g} JIT replay(s) launching {kernels:g} kernels in {graphs:g} graph(s): {_us(per_call)} a call "
                f"+ {per_kernel:.3g} µs a kernel, the target's measured launch and synchronization cost "
                f"({facts[0].source})")
