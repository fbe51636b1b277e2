"""FutureSight: a cost model that orders and rejects legal settings before anything runs (CPU only).

For one kernel (its bytes and operations by the compiler's own estimate, its axes) and one setting:

  threads        outputs / upcast x group (a group splits each output's reduction over its threads)
  resident       per multiprocessor: as many groups as fit its threads (a group takes whole thread
                 groups of the warp width) and its group limit; times the multiprocessors
  in flight      min(threads, resident) x bytes per load x unroll   (Little's law)
  in use         with fewer groups than multiprocessors, that rate times the share in use
  memory time    bytes / min(bandwidth, in flight / latency) (x multiprocessors / groups, when fewer)
  compute time   operations / (peak rate x the fraction of lanes the threads fill)
  tail           groups over multiprocessors: past one wave, a last partial wave costs a whole one
  prediction     max(memory, compute) x tail

A fact the target does not declare leaves its term out (no latency: no Little's law; no
multiprocessors: no tail), and the prediction says which terms it used. A setting whose
prediction is over REJECT_RATIO times the kernel's best is rejected with that reason; the rest are
ordered fastest first. Predictions are compared with measurements by rank (Spearman), never trusted
as times. Its constants (bytes in flight per thread, whether unrolling adds loads in flight) are data:
data/futuresight.toml per target, fitted to measured settings by `fit` (`boltbeam search-calibrate`);
a target without an entry gets the physical defaults. The same file holds, per target, the
fraction of the bandwidth a generated family's products reached by who wrote them (WRITERS), which
the whole-token search (search/choose.py) divides the bandwidth by; unmeasured, the whole of it.
"""
from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from statistics import median

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput

REJECT_RATIO = 4.0
LOAD_BYTES = 16     # the default: one wide load in flight per thread and unrolled step
# What `fit` tries: bytes in flight per thread, and whether unrolled steps add to it.
FIT_BYTES = (4, 8, 16, 32, 64, 128)
FIT_UNROLL = (True, False)
PER_KERNEL_FACT = "launch_sync_per_kernel"    # the target's measured cost of one more kernel in a token


# Who writes the code of a generated family's products: the compiler from tensor code, or BoltBeam at
# tinygrad's UOp level. The fraction of the bandwidth each reached on a target is measured
# (`boltbeam search-calibrate --layout-trace`), not derived.
WRITERS = ("tensor_code", "generated_kernel")


@dataclass(frozen=True)
class Calibration:
    bytes_in_flight_per_thread: int = LOAD_BYTES
    unroll_adds_in_flight: bool = True
    bandwidth_fraction: dict[str, float] = field(default_factory=dict)   # WRITERS -> measured fraction

    def fraction(self, writer: str) -> float:
        """The fraction of the bandwidth products written this way reached here (1 where unmeasured)."""
        return self.bandwidth_fraction.get(writer, 1.0)


def calibration(target_name: str, text: str | None = None) -> Calibration:
    """The target's fitted constants from data/futuresight.toml (or `text`); the defaults without an entry."""
    text = text if text is not None else resources.files("boltbeam.data").joinpath("futuresight.toml").read_text()
    try:
        entry = tomllib.loads(text).get(target_name)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"futuresight.toml: not valid TOML ({e})") from None
    if entry is None:
        return Calibration()
    b, u = entry.get("bytes_in_flight_per_thread"), entry.get("unroll_adds_in_flight")
    if not isinstance(b, int) or isinstance(b, bool) or b < 1 or u not in (0, 1):
        raise BadInput(f"futuresight.toml: {target_name} needs bytes_in_flight_per_thread >= 1 and "
                       f"unroll_adds_in_flight 0 or 1")
    table = entry.get("bandwidth_fraction", {})
    fractions = {k: v for k, v in table.items() if k not in ("source", "date")} if isinstance(table, dict) else None
    if not isinstance(fractions, dict) or not all(
            w in WRITERS and isinstance(v, float) and 0 < v <= 1 for w, v in fractions.items()):
        raise BadInput(f"futuresight.toml: {target_name}.bandwidth_fraction maps {' or '.join(WRITERS)} "
                       f"to a fraction in (0, 1]")
    return Calibration(b, bool(u), dict(fractions))


@dataclass(frozen=True)
class Work:
    """What the cost model knows of a kernel: the compiler's estimates and the axes settings split."""
    bytes: int
    flops: int
    outputs: int          # output elements (all output axes)


def outputs_at(ast, renderer, var_vals: dict[str, int]) -> int:
    """Output elements of a scheduled kernel (its global and loop axes) with its symbolic sizes at `var_vals`."""
    from tinygrad.codegen.opt.postrange import Scheduler
    from tinygrad.uop.ops import AxisType, sym_infer
    k = Scheduler(ast, renderer)
    k.convert_loop_to_global()
    return math.prod(max(1, int(sym_infer(k.full_shape[i], var_vals))) for i in k.axes_of(AxisType.GLOBAL, AxisType.LOOP))


@dataclass
class Prediction:
    us: float
    memory_us: float
    compute_us: float
    tail: float
    terms: list[str] = field(default_factory=list)   # the terms the target's facts allowed


def predict(work: Work, setting: dict[str, int], target: Target, cal: Calibration = Calibration()) -> Prediction:
    upcast, unroll = setting.get("upcast", 1), setting.get("unroll", 1)
    local, group = setting.get("local", 1), setting.get("group", 1)
    threads = max(1, work.outputs // upcast) * group
    per_group = local * group
    groups = max(1, threads // per_group)
    terms = ["bandwidth"]
    bandwidth = target.bandwidth
    sms, per_sm = target.fact("multiprocessors"), target.fact("max_threads_per_multiprocessor")
    fit = None            # groups resident on one multiprocessor at once
    if sms and per_sm:
        width = target.fact("thread_group_width") or 1
        fit = max(1, int(per_sm // (math.ceil(per_group / width) * width)))
        if limit := target.fact("max_groups_per_multiprocessor"):
            fit = min(fit, int(limit))
            terms.append("group limit")
    resident = threads if fit is None else min(threads, int(sms * fit * per_group))
    latency = target.fact("memory_latency")
    if latency:
        per_thread = cal.bytes_in_flight_per_thread * (unroll if cal.unroll_adds_in_flight else 1)
        bandwidth = min(bandwidth, resident * per_thread / latency)
        terms.append("little's law")
    if sms and groups < sms:
        # A group runs on one multiprocessor, and fewer groups than multiprocessors leave the rest idle.
        # Measured on the H200, such launches ran slower than Little's law on their threads alone says,
        # by about the share of multiprocessors idle; scaled by the share in use, the order of the
        # settings searches timed there comes out better (bench/h200/families/README.md).
        bandwidth = bandwidth * groups / sms
        terms.append("multiprocessors in use")
    memory_us = work.bytes / bandwidth * 1e6
    peak = target.fact("peak_fp32")
    compute_us = 0.0
    if peak:
        lanes = (sms or 1) * (target.fact("thread_group_width") or 1)
        compute_us = work.flops / (peak * min(1.0, threads / lanes)) * 1e6
        terms.append("compute")
    tail = 1.0
    if sms:
        waves = groups / (sms * (fit or 1))
        # A partial last wave costs a whole one; under one wave the idle multiprocessors are counted above.
        tail = math.ceil(waves) / waves if waves > 1 else 1.0
        terms.append("waves")
    return Prediction(max(memory_us, compute_us) * tail, memory_us, compute_us, tail, terms)


@dataclass(frozen=True)
class Foreseen:
    """FutureSight's view of one setting of a generated family, on the whole token: bytes a token reads,
    kernels it launches (net: negative where it removes some), and the time to move those bytes at the rate
    its kernels can reach (terms: what limited that rate; fraction: the measured fraction of the bandwidth it
    was moved at, 1 where none applies). Each family's module gives its own (route/family.py)."""
    bytes: int
    kernels: int
    memory_us: float
    terms: tuple[str, ...]
    fraction: float = 1.0

    def us(self, target: Target) -> float:
        """The prediction: moving the bytes, plus the target's measured cost of each kernel."""
        return self.memory_us + self.kernels * (target.fact(PER_KERNEL_FACT) or 0.0) * 1e6


@dataclass
class Sight:
    ordered: list[tuple[dict[str, int], Prediction]]          # survivors, predicted fastest first
    rejected: list[tuple[dict[str, int], Prediction, str]]


def foresee(work: Work, settings: list[dict[str, int]], target: Target, cal: Calibration = Calibration()) -> Sight:
    """Order the legal settings by prediction; reject those far slower than the best prediction."""
    scored = sorted(((s, predict(work, s, target, cal)) for s in settings), key=lambda x: x[1].us)
    if not scored:
        return Sight([], [])
    best = scored[0][1].us
    keep = [(s, p) for s, p in scored if p.us <= REJECT_RATIO * best]
    out = [(s, p, f"predicted {p.us:,.3g} µs, over {REJECT_RATIO:g}x the best prediction ({best:,.3g} µs)")
           for s, p in scored if p.us > REJECT_RATIO * best]
    return Sight(keep, out)


@dataclass(frozen=True)
class Point:
    """One measured setting of one kernel: what calibration and its check are made of."""
    kernel: str
    work: Work
    setting: dict[str, int]
    measured_us: float


def rank_correlation(predicted: list[float], measured: list[float]) -> float | None:
    """Spearman's rho, or None where it says nothing: under 3 points, or either side all alike."""
    from scipy.stats import spearmanr
    if len(predicted) < 3 or len(set(predicted)) < 2 or len(set(measured)) < 2:
        return None
    return float(spearmanr(predicted, measured).statistic)


def within_spearman(points: list[Point], target: Target, cal: Calibration) -> tuple[float | None, int]:
    """The median over kernels (at least 3 distinct predictions and times each) of the rank correlation
    between prediction and measurement within one kernel: how well FutureSight orders what it is asked
    to order. (median or None, kernels counted)."""
    by_kernel: dict[str, list[Point]] = {}
    for p in points:
        by_kernel.setdefault(p.kernel, []).append(p)
    rhos = [rho for pts in by_kernel.values()
            if (rho := rank_correlation([predict(p.work, p.setting, target, cal).us for p in pts],
                                        [p.measured_us for p in pts])) is not None]
    return (median(rhos) if rhos else None), len(rhos)


def fit(points: list[Point], target: Target) -> tuple[Calibration, float | None]:
    """The constants, of FIT_BYTES x FIT_UNROLL, that order the measured settings best within each kernel."""
    scored = [(within_spearman(points, target, c)[0], c) for c in
              (Calibration(b, u) for b, u in itertools.product(FIT_BYTES, FIT_UNROLL))]
    scored = [(rho, c) for rho, c in scored if rho is not None]
    if not scored:
        raise BadInput("no kernel has 3 measured settings with distinct times: nothing to fit")
    rho, cal = max(scored, key=lambda x: x[0])
    return cal, rho
