"""BoltBeam decides: time only FutureSight's survivors, within a budget, pick per kernel, write the route.

For each distinct kernel of the decode token: BubbleBeam's legal settings, FutureSight's order, then
up to `budget` survivors timed alone on the device against tinygrad's own heuristics for that kernel.
Every timing goes in the ledger with its scope (device, target, compiler, family, kernel, setting);
a setting the ledger already holds in the same scope is never timed again: its recorded time is
reused. A setting joins the route only when it beats the default by more than NOISE. The whole token
is judged elsewhere (`boltbeam search` profiles it with and without the route).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from boltbeam.bound.targets import Target
from boltbeam.judge.verdicts import CANDIDATE, DIAGNOSTIC, REFUTE, SEARCH_SPACE_INCOMPLETE
from boltbeam.measure.route import Choice, Route, engine
from boltbeam.search.compiler import Captured, build, opts_of, time_program
from boltbeam.search.future import (Calibration, Point, Prediction, Work, calibration, foresee, rank_correlation,
                                    within_spearman)
from boltbeam.search.space import Family, Space, propose

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
        return {"device": self.device, "target": self.target, "engine": self.engine, "family": self.family,
                "reps": self.reps, "kernel": kernel, "setting": setting}


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


def _recorded(ledger, candidate: str, scope: dict[str, Any]) -> float | None:
    """The time the ledger holds for this candidate in this scope (its latest entry), if any."""
    if ledger is None:
        return None
    for e in reversed(ledger.entries(candidate=candidate)):
        if all(e.scope.get(k) == v for k, v in scope.items()) and (us := measured_us(e.scope)) is not None:
            return us
    return None


def measured_us(scope: dict[str, Any]) -> float | None:
    """The time an entry's scope records, when it is a positive finite number (anything else: none)."""
    us = scope.get("measured_us")
    ok = isinstance(us, (int, float)) and not isinstance(us, bool) and math.isfinite(us) and us > 0
    return float(us) if ok else None


def _record(ledger, c: Captured, sid: str, scope: Scope, us: float, default_us: float | None) -> None:
    if ledger is None:
        return
    if default_us is None:
        verdict, reasons, reopen = DIAGNOSTIC, [f"tinygrad's heuristics: {us:,.3f} µs alone on the device"], None
    elif us < (1 - NOISE) * default_us:
        verdict, reasons, reopen = CANDIDATE, [f"{us:,.3f} µs against the default's {default_us:,.3f} µs"], None
    else:
        verdict = REFUTE
        reasons = [f"{us:,.3f} µs, not faster than the default's {default_us:,.3f} µs by more than {NOISE:.0%}"]
        reopen = f"engine!={scope.engine}"
    ledger.append(candidate=f"{c.shape.key}:{sid}", verdict=verdict, reasons=reasons,
                  scope={**scope.of(c.shape.key, sid), "measured_us": us, "kernel_name": c.shape.name},
                  evidence=[], reopen=reopen, actor=ACTOR)


class _Timer:
    """Times settings on the device, or reads them from the ledger when it holds them in this scope;
    records every new timing; keeps the counts and the device clock."""

    def __init__(self, scope: Scope, ledger):
        self.scope, self.ledger = scope, ledger
        self.seconds = 0.0
        self.timed_now = self.reused = 0

    def time(self, c: Captured, setting: dict[str, int] | None, default_us: float | None = None) -> float | str:
        """µs of this setting (None: tinygrad's heuristics), or the compiler's refusal."""
        sid = "default" if setting is None else setting_id(setting)
        if (us := _recorded(self.ledger, f"{c.shape.key}:{sid}", self.scope.of(c.shape.key, sid))) is not None:
            self.reused += 1
            return us
        t0 = time.perf_counter()
        prg = build(c, None if setting is None else opts_of(setting, c.shape))
        samples = prg if isinstance(prg, str) else time_program(c, prg, REPS)
        self.seconds += time.perf_counter() - t0
        if isinstance(samples, str):
            return samples
        self.timed_now += 1
        _record(self.ledger, c, sid, self.scope, min(samples), default_us)
        return min(samples)


def search(kernels: list[Captured], fam: Family, target: Target, device: str, budget: int, ledger=None,
           model_sha256: str | None = None, progress: Callable[[str], None] = lambda s: None,
           seconds_per_kernel: float = math.inf) -> Search:
    """`budget` settings at most per kernel, and no new one once the kernel has had `seconds_per_kernel`."""
    scope = Scope(device, target.name, engine(), fam.name)
    cal = calibration(target.name)
    timer = _Timer(scope, ledger)
    results = []
    unbuilt: dict[str, str] = {}
    for i, c in enumerate(kernels):
        progress(f"kernel {i + 1} of {len(kernels)}: {c.shape.name}")
        space = propose(c.shape, fam, target)
        work = Work(c.bytes, c.flops, max(1, c.shape.outputs))
        sight = foresee(work, space.legal, target, cal)
        default_us = timer.time(c, None)
        if isinstance(default_us, str):   # tinygrad's own build failed: nothing to compare against
            unbuilt[c.shape.name] = default_us
            continue
        r = KernelResult(c.launches, c.bytes / target.bandwidth * 1e6, space, work, len(sight.rejected),
                         len(sight.ordered), Timed({}, None, default_us))
        started = timer.seconds
        for setting, pred in sight.ordered[:budget]:
            if timer.seconds - started > seconds_per_kernel:
                break
            us = timer.time(c, setting, default_us)
            if isinstance(us, str):
                r.refused[setting_id(setting)] = us
            else:
                r.timed.append(Timed(setting, pred, us))
        best = min(r.timed, key=lambda t: t.measured_us, default=None)
        if best and best.measured_us < (1 - NOISE) * default_us:
            r.choice = best
        if r.incomplete and ledger is not None:
            _incomplete(ledger, r, scope)
        results.append(r)
    route = Route(model_sha256, scope.engine, device, target.name, fam.name, "generated by search", [
        Choice(r.key, r.name, r.choice.setting, opts_of(r.choice.setting, r.space.kernel),
               r.choice.measured_us, r.default.measured_us, r.choice.predicted.us if r.choice.predicted else None)
        for r in results if r.choice])
    return Search(results, route, timer.seconds, timer.timed_now, timer.reused, unbuilt, cal)


def _incomplete(ledger, r: KernelResult, scope: Scope) -> None:
    candidate = f"{r.key}:space"
    if _recorded(ledger, candidate, scope.of(r.key, "space")) is not None:
        return
    ledger.append(candidate=candidate, verdict=SEARCH_SPACE_INCOMPLETE,
                  reasons=[f"{r.name}: its best, {r.best_us:,.3f} µs with every survivor timed, is "
                           f"{r.best_us / r.floor_us:,.1f}x its floor of {r.floor_us:,.3f} µs (bytes / bandwidth): "
                           f"the {scope.family} family cannot reach it; the layout and gemv geometry families "
                           f"(generated routes) are what the bound says is missing"],
                  scope={**scope.of(r.key, "space"), "measured_us": r.best_us, "kernel_name": r.name},
                  evidence=[], reopen=f"family!={scope.family}", actor=ACTOR)


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
