"""FutureSight: a cost model that orders and rejects legal settings before anything runs (CPU only).

For one kernel (its bytes and operations by the compiler's own estimate, its axes) and one setting:

  threads        outputs / upcast x group (a group splits each output's reduction over its threads)
  resident       per multiprocessor: as many groups as fit its threads (a group takes whole thread
                 groups of the warp width) and its group limit; times the multiprocessors
  in flight      min(threads, resident) x bytes per load x unroll   (Little's law)
  memory time    bytes / min(bandwidth, in flight / latency)
  compute time   operations / (peak rate x the fraction of lanes the threads fill)
  tail           groups over multiprocessors: past one wave, a last partial wave costs a whole one
  prediction     max(memory, compute) x tail

A fact the target does not declare leaves its term out (no latency: no Little's law; no
multiprocessors: no tail), and the prediction says which terms it used. A setting whose
prediction is over REJECT_RATIO times the kernel's best is rejected with that reason; the rest are
ordered fastest first. Predictions are compared with measurements by rank (Spearman), never trusted
as times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from boltbeam.bound.targets import Target

REJECT_RATIO = 4.0
LOAD_BYTES = 16     # one wide load in flight per thread and unrolled step


@dataclass(frozen=True)
class Work:
    """What the cost model knows of a kernel: the compiler's estimates and the axes settings split."""
    bytes: int
    flops: int
    outputs: int          # output elements (all output axes)


@dataclass
class Prediction:
    us: float
    memory_us: float
    compute_us: float
    tail: float
    terms: list[str] = field(default_factory=list)   # the terms the target's facts allowed


def predict(work: Work, setting: dict[str, int], target: Target) -> Prediction:
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
        bandwidth = min(bandwidth, resident * LOAD_BYTES * unroll / latency)
        terms.append("little's law")
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
        # A partial last wave costs a whole one; under one wave the idle multiprocessors are already
        # counted by Little's law (fewer threads in flight).
        tail = math.ceil(waves) / waves if waves > 1 else 1.0
        terms.append("waves")
    return Prediction(max(memory_us, compute_us) * tail, memory_us, compute_us, tail, terms)


@dataclass
class Sight:
    ordered: list[tuple[dict[str, int], Prediction]]          # survivors, predicted fastest first
    rejected: list[tuple[dict[str, int], Prediction, str]]


def foresee(work: Work, settings: list[dict[str, int]], target: Target) -> Sight:
    """Order the legal settings by prediction; reject those far slower than the best prediction."""
    scored = sorted(((s, predict(work, s, target)) for s in settings), key=lambda x: x[1].us)
    if not scored:
        return Sight([], [])
    best = scored[0][1].us
    keep = [(s, p) for s, p in scored if p.us <= REJECT_RATIO * best]
    out = [(s, p, f"predicted {p.us:,.3g} µs, over {REJECT_RATIO:g}x the best prediction ({best:,.3g} µs)")
           for s, p in scored if p.us > REJECT_RATIO * best]
    return Sight(keep, out)
