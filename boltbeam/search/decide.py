"""BoltBeam decides: time only FutureSight's survivors, within a budget, pick per kernel, write the route.

For each distinct kernel of the decode token: BubbleBeam's legal settings, FutureSight's order, then
up to `budget` survivors timed alone on the device against tinygrad's own heuristics for that kernel,
the default timed again beside each. Planning happens in one process; the timing of each kernel's plan
may happen on another's device (search/fanout.py); the records come back and one writer appends them.
Every timing and refusal goes in the ledger with its scope (device, target, compiler, family, kernel,
setting); a setting the ledger already holds in the same scope is never timed again. A setting joins
the route only when it beats the default by more than NOISE. The whole token is judged elsewhere
(`boltbeam search` profiles it with and without the route).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from boltbeam.bound.targets import Target
from boltbeam.judge.scope import ScopeKey
from boltbeam.judge.verdicts import CANDIDATE, DIAGNOSTIC, REFUTE, SEARCH_SPACE_INCOMPLETE
from boltbeam.ledger.reopen import unless
from boltbeam.measure.route import Choice, Route, engine
from boltbeam.search.compiler import Captured, Kernel, build, opts_of, time_program
from boltbeam.foresight.future import (Calibration, Point, Prediction, Work, calibration, foresee, rank_correlation,
                                    within_spearman)
from boltbeam.foresight.space import Family, Space, propose

NOISE = 0.05               # a setting must beat the default by more than this (best of REPS each)
REPS = 5
INCOMPLETE_RATIO = 5.0     # a kernel whose best, its space exhausted, stays above 5x its floor
ACTOR = "boltbeam search"


@dataclass(frozen=True)
class Scope:
    """What a timing holds for: the same kernel, setting, family, device, target, compiler and method
    (repetitions). Not the machine: two machines declared as one target share their timings."""
    device: str
    target: str
    engine: str
    family: str
    reps: int = REPS

    def of(self, kernel: str, setting: str) -> dict[str, Any]:
        """The scope of one kernel's setting: the ledger's key for its time."""
        return {ScopeKey.DEVICE: self.device, ScopeKey.TARGET: self.target, ScopeKey.ENGINE: self.engine,
                ScopeKey.FAMILY: self.family, ScopeKey.REPS: self.reps, ScopeKey.KERNEL: kernel,
                ScopeKey.SETTING: setting}

    def timed(self, kernel: str, name: str, setting: str, us: float | str) -> dict[str, Any]:
        """What the ledger records of one kernel's setting: its scope, the kernel's name, and its time (µs)
        or the compiler's refusal."""
        found = ScopeKey.REFUSED if isinstance(us, str) else ScopeKey.MEASURED_US
        return self.of(kernel, setting) | {ScopeKey.KERNEL_NAME: name, found: us}


@dataclass
class Timed:
    setting: dict[str, int]
    predicted: Prediction | None
    measured_us: float


@dataclass
class KernelResult:
    launches: int
    floor_us: float
    space: Space
    work: Work
    foreseen_out: int                      # legal settings FutureSight rejected
    survivors: int
    default: Timed
    timed: list[Timed] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)   # setting -> the compiler's refusal
    choice: Timed | None = None

    @property
    def key(self) -> str:
        return self.space.kernel.key

    @property
    def name(self) -> str:
        return self.space.kernel.name

    @property
    def best_us(self) -> float:
        return self.choice.measured_us if self.choice else self.default.measured_us

    @property
    def exhausted(self) -> bool:
        return len(self.timed) + len(self.refused) >= self.survivors

    @property
    def incomplete(self) -> bool:
        return self.exhausted and self.floor_us > 0 and self.best_us > INCOMPLETE_RATIO * self.floor_us


@dataclass
class Search:
    kernels: list[KernelResult]
    route: Route
    seconds_timing: float          # wall time spent compiling and timing on the device
    timed_now: int
    reused: int
    unbuilt: dict[str, str] = field(default_factory=dict)   # kernel -> why its default could not be built or timed
    calibration: Calibration = field(default_factory=Calibration)


def setting_id(setting: dict[str, int]) -> str:
    """A setting as the ledger names it: `name=value` pairs, sorted, comma-separated."""
    return ",".join(f"{k}={v}" for k, v in sorted(setting.items()))


def parse_setting(text: Any) -> dict[str, int] | None:
    """setting_id read back; None for anything it did not write (the default, a space verdict, junk)."""
    try:
        pairs = [kv.split("=") for kv in str(text).split(",")]
        return {k: int(v) for k, v in pairs}
    except ValueError:
        return None


def _recorded(ledger, candidate: str, scope: dict[str, Any]) -> float | str | None:
    """What the ledger holds for this candidate in this scope (its latest entry): its time, or the
    compiler's refusal; None when it holds neither."""
    from boltbeam.ledger.store import scope_matches
    if ledger is None:
        return None
    for e in reversed(ledger.entries(candidate=candidate)):
        if scope_matches(e.scope, scope):
            if (us := measured_us(e.scope)) is not None:
                return us
            if isinstance(refused := e.scope.get(ScopeKey.REFUSED), str):
                return refused
    return None


def measured_us(scope: dict[str, Any]) -> float | None:
    """The time an entry's scope records, when it is a positive finite number (anything else: none)."""
    us = scope.get(ScopeKey.MEASURED_US)
    ok = isinstance(us, (int, float)) and not isinstance(us, bool) and math.isfinite(us) and us > 0
    return float(us) if ok else None


@dataclass(frozen=True)
class Plan:
    """One kernel's work for a device: the survivors to time, in FutureSight's order, and the times the
    ledger already holds in this scope (by setting id; "default" is tinygrad's heuristics)."""
    key: str
    settings: list[dict[str, int]]
    known: dict[str, float | str]   # a time, or the compiler's refusal
    seconds: float            # no new setting once the kernel has had this many seconds of its own


@dataclass(frozen=True)
class Record:
    """A timing for the ledger. Devices return records; one writer (the search's coordinator) appends them."""
    candidate: str
    verdict: str
    reasons: list[str]
    scope: dict[str, Any]
    reopen: str | None

    def append_to(self, ledger) -> None:
        ledger.append(candidate=self.candidate, verdict=self.verdict, reasons=self.reasons, scope=self.scope,
                      evidence=[], reopen=self.reopen, actor=ACTOR)


@dataclass
class Timings:
    """What a device returns for one plan: the default's time (or why it could not be built or timed),
    each setting's time or refusal in the plan's order, and the records of what it timed now."""
    key: str
    default_us: float | str
    measured: list[tuple[dict[str, int], float | str]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    seconds: float = 0.0
    timed_now: int = 0
    reused: int = 0


def _record(c: Captured, sid: str, scope: Scope, us: float | str, default_us: float | None) -> Record:
    recorded = scope.timed(c.shape.key, c.shape.name, sid, us)
    if isinstance(us, str):   # refused by the compiler or the launch: recorded, so not tried again
        return Record(f"{c.shape.key}:{sid}", REFUTE, [us], recorded, unless(ScopeKey.ENGINE, scope.engine))
    if default_us is None:
        verdict, reasons, reopen = DIAGNOSTIC, [f"tinygrad's heuristics: {us:,.3f} µs alone on the device"], None
    elif us < (1 - NOISE) * default_us:
        verdict, reasons, reopen = CANDIDATE, [f"{us:,.3f} µs against the default's {default_us:,.3f} µs"], None
    else:
        verdict = REFUTE
        reasons = [f"{us:,.3f} µs, not faster than the default's {default_us:,.3f} µs by more than {NOISE:.0%}"]
        reopen = unless(ScopeKey.ENGINE, scope.engine)
    return Record(f"{c.shape.key}:{sid}", verdict, reasons, recorded, reopen)


def _best(c: Captured, prg) -> float | str:
    samples = time_program(c, prg, REPS)
    return samples if isinstance(samples, str) else min(samples)


def time_kernel(c: Captured, plan: Plan, scope: Scope) -> Timings:
    """Times a plan on this process's device. Whenever a setting is timed now, the default is timed now
    too, on the same device, again after each new setting: its time is the best of those runs, so a
    setting is only ever compared with a default timed beside it (never with another device's)."""
    new = [s for s in plan.settings if setting_id(s) not in plan.known]
    if not new and isinstance(plan.known.get("default"), float):
        return Timings(plan.key, plan.known["default"], [(s, plan.known[setting_id(s)]) for s in plan.settings],
                       reused=len(plan.settings) + 1)
    t0 = time.perf_counter()
    default = build(c, None)
    first = default if isinstance(default, str) else _best(c, default)
    if isinstance(first, str):   # tinygrad's own build failed: nothing to compare against
        return Timings(plan.key, first, seconds=time.perf_counter() - t0)
    out = Timings(plan.key, first, timed_now=1)
    defaults, fresh = [first], []
    for setting in plan.settings:
        sid = setting_id(setting)
        if time.perf_counter() - t0 > plan.seconds:
            break
        if sid in plan.known:
            out.measured.append((setting, plan.known[sid]))
            out.reused += 1
            continue
        prg = build(c, opts_of(setting, c.shape))
        us = prg if isinstance(prg, str) else _best(c, prg)
        out.measured.append((setting, us))
        fresh.append((sid, us))
        if isinstance(us, float):
            out.timed_now += 1
            if isinstance(again := _best(c, default), float):
                defaults.append(again)
    out.default_us = min(defaults)
    out.records = [_record(c, "default", scope, out.default_us, None)] + [
        _record(c, sid, scope, us, out.default_us) for sid, us in fresh]
    out.seconds = time.perf_counter() - t0
    return out


def known_times(ledger, scope: Scope, key: str, settings: list[dict[str, int]]) -> dict[str, float | str]:
    """The times (or refusals) the ledger holds for this kernel's default and settings in this scope."""
    out = {}
    for sid in ["default"] + [setting_id(s) for s in settings]:
        if (us := _recorded(ledger, f"{key}:{sid}", scope.of(key, sid))) is not None:
            out[sid] = us
    return out


TimeAll = Callable[[list[Plan], Scope], Iterator[Timings]]


def in_process(captured: list[Captured]) -> TimeAll:
    """Plans timed one after another on this process's device."""
    by_key = {c.shape.key: c for c in captured}
    return lambda plans, scope: (time_kernel(by_key[p.key], p, scope) for p in plans)


def search(kernels: list[Kernel], fam: Family, target: Target, device: str, budget: int, time_all: TimeAll,
           ledger=None, model_sha256: str | None = None, progress: Callable[[str], None] = lambda s: None,
           seconds_per_kernel: float = math.inf) -> Search:
    """`budget` settings at most per kernel, and no new one once the kernel has had `seconds_per_kernel`.
    BubbleBeam and FutureSight plan here; `time_all` times the plans (in this process or on a cluster's
    devices) and yields them as they finish; their records are appended here, one writer."""
    scope = Scope(device, target.name, engine(), fam.name)
    cal = calibration(target.name)
    planned = []
    for c in kernels:
        space = propose(c.shape, fam, target)
        work = Work(c.bytes, c.flops, max(1, c.shape.outputs))
        sight = foresee(work, space.legal, target, cal)
        settings = [s for s, _ in sight.ordered[:budget]]
        planned.append((c, space, work, sight,
                        Plan(c.shape.key, settings, known_times(ledger, scope, c.shape.key, settings), seconds_per_kernel)))
    timings: dict[str, Timings] = {}
    for t in time_all([p for *_, p in planned], scope):
        timings[t.key] = t
        if ledger is not None:
            for rec in t.records:
                rec.append_to(ledger)
        progress(f"timed {len(timings)} of {len(planned)} kernels")
    results, unbuilt = [], {}
    for c, space, work, sight, plan in planned:
        t = timings[plan.key]
        if isinstance(t.default_us, str):
            unbuilt[c.shape.name] = t.default_us
            continue
        r = KernelResult(c.launches, c.bytes / target.bandwidth * 1e6, space, work, len(sight.rejected),
                         len(sight.ordered), Timed({}, None, t.default_us))
        predicted = {setting_id(s): p for s, p in sight.ordered[:budget]}
        for setting, us in t.measured:
            if isinstance(us, str):
                r.refused[setting_id(setting)] = us
            else:
                r.timed.append(Timed(setting, predicted[setting_id(setting)], us))
        best = min(r.timed, key=lambda x: x.measured_us, default=None)
        if best and best.measured_us < (1 - NOISE) * t.default_us:
            r.choice = best
        if r.incomplete and ledger is not None:
            _incomplete(ledger, r, scope)
        results.append(r)
    route = Route(model_sha256, scope.engine, device, target.name, fam.name, "generated by search", [
        Choice(r.key, r.name, r.choice.setting, opts_of(r.choice.setting, r.space.kernel),
               r.choice.measured_us, r.default.measured_us, r.choice.predicted.us if r.choice.predicted else None)
        for r in results if r.choice])
    return Search(results, route, sum(t.seconds for t in timings.values()), sum(t.timed_now for t in timings.values()),
                  sum(t.reused for t in timings.values()), unbuilt, cal)


def _incomplete(ledger, r: KernelResult, scope: Scope) -> None:
    candidate = f"{r.key}:space"
    if _recorded(ledger, candidate, scope.of(r.key, "space")) is not None:
        return
    ledger.append(candidate=candidate, verdict=SEARCH_SPACE_INCOMPLETE,
                  reasons=[f"{r.name}: its best, {r.best_us:,.3f} µs with every survivor timed, is "
                           f"{r.best_us / r.floor_us:,.1f}x its floor of {r.floor_us:,.3f} µs (bytes / bandwidth): "
                           f"the {scope.family} family cannot reach it; the layout and gemv geometry families "
                           f"(generated routes) are what the bound says is missing"],
                  scope=scope.timed(r.key, r.name, "space", r.best_us), evidence=[],
                  reopen=unless(ScopeKey.FAMILY, scope.family), actor=ACTOR)


def spearman_by_kind(result: Search) -> dict[str, tuple[float | None, int]]:
    """Rank correlation of FutureSight's predictions with the measured times, per kind of kernel
    (reductions and elementwise), over every timed setting: (rho or None when undefined, points)."""
    out: dict[str, tuple[float | None, int]] = {}
    for kind in ("reduce", "elementwise"):
        pairs = [(t.predicted.us, t.measured_us) for r in result.kernels
                 if (r.space.kernel.reduce is not None) == (kind == "reduce") for t in r.timed if t.predicted]
        out[kind] = (rank_correlation([p for p, _ in pairs], [m for _, m in pairs]), len(pairs))
    return out


def points(result: Search) -> list[Point]:
    return [Point(r.key, r.work, t.setting, t.measured_us) for r in result.kernels for t in r.timed]


def spearman_within_kernels(result: Search, target: Target) -> tuple[float | None, int]:
    """How well FutureSight ordered each kernel's timed settings: the median over kernels of Spearman."""
    return within_spearman(points(result), target, result.calibration)
