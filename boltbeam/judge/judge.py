"""The judge: did the change help? Two traces (baseline A, candidate B) and a checks file in, exactly
one of the eight verdicts out, each with its reasons in plain sentences and the numbers behind them.

promote needs five gates to pass, each read from the traces and the checks:

  correct  the candidate's output tokens match a reference engine's where the checks carry its tokens, else the
           baseline's (within `token_tolerance`); the judgement says which (checked_against)
  route    the candidate's route label (provenance of what executed) is `expected_route`
  faster   the whole token is faster beyond noise: a one-sided Mann-Whitney U test at `alpha` AND both
           ends of the bootstrap interval of the median's relative change beyond `threshold`
  memory   the candidate's peak_bytes fits capacity_bytes (from the checks, else the trace)
  switch   the candidate's route names the switch that turns it off

The verdict, first rule that applies:

  adapter-incomplete       the evidence cannot be read safely: a trace with no samples, A and B on
                           different workloads, models, devices or engines, or a measurement error (a token faster than
                           its physics floor); the CLI refuses (exit 3) on a measurement error
  diagnostic               B ran the same route as A: a measurement of noise, no claim about a change
  search-space-incomplete  the checks say the search space cannot express the candidate yet
  refute                   a gate failed firmly (wrong tokens, silent fallback, slower, memory over)
  inconclusive             a gate has no evidence, or the change is inside noise
  defer                    every gate passed but the win waits on `missing_capability`
  promote                  every gate passed
(`candidate`, "worth timing, not judged yet", belongs to the search; the judge never gives it.)
Samples should be interleaved A/B runs (the measurer's job): the test assumes both saw the same machine.
One process's tokens do not show the spread between processes of one route (on the H200 one route's two
processes on one machine measured 3.6% apart, bench/h200/pooled/): judge_processes takes several traces a
side, judges every pair, and gives a verdict only where every pair gives it (else inconclusive).

Checks file: one JSON object; every key is optional and an unknown key is bad input (catches typos).

  expected_route      str    the route label the candidate must carry; without it, route has no evidence
  token_tolerance     float  fraction of output tokens allowed to differ (sampled output); default 0
  threshold           float  smallest relative change of the median token that counts; default 0.01
  alpha               float  significance level of the one-sided test; default 0.05 (interval 1 - alpha)
  capacity_bytes      int    memory on the target; overrides the candidate trace's memory.capacity_bytes
  token_floor_us      float  physics floor of one whole token, µs; a measured token below it is an error
  role_floors_us      {role: float}  floor per weight role and token, µs, checked on the per-kernel pass
  expressible         bool   false when the search space cannot express the candidate yet; default true
  expressible_reason  str    why not; required when expressible is false
  missing_capability  str    the capability a win waits on: a candidate that would promote is deferred
  candidate_id        str    the id the ledger records; default the candidate's route label
  reopen              str    when a refuted or inexpressible idea may be tried again; default written
                             from what failed
  reference_tokens    [int]  a reference engine's greedy tokens on the same prompt ids (what `profile --engine
                             llama.cpp` records as output_tokens): the candidate's must equal them over the steps
                             both decoded (within token_tolerance); without them the output is held to the baseline's
  reference_engine    str    the engine that decoded reference_tokens; required with them
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, NamedTuple

import numpy as np

from boltbeam.account.tieout import role_of
from boltbeam.errors import BadInput
from boltbeam.files import load_json
from boltbeam.judge.scope import JudgedScope
from boltbeam.judge.verdicts import (ADAPTER_INCOMPLETE, DEFER, DIAGNOSTIC, INCONCLUSIVE, NEEDS_REOPEN,
                                     PROMOTE, REFUTE, SEARCH_SPACE_INCOMPLETE)
from boltbeam.measure.trace import Trace
from boltbeam.units import is_number

PASS, FAIL, NO_EVIDENCE = "pass", "fail", "no-evidence"
MIN_SAMPLES = 5                 # per side; fewer is no evidence about speed
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0              # fixed: the same traces always get the same interval and verdict
MEASUREMENT_ERROR = "measurement error:"

# Workload facts that must match between A and B for the comparison to mean anything: the same model at the
# same depth and batch, on the same device through the same engine (a CUDA token against a CPU one, or
# llama.cpp's against tinygrad's, says nothing about a route).
SAME_WORKLOAD = (("workload", "context"), ("workload", "batch"), ("environment", "model_sha256"),
                 ("environment", "device"), ("environment", "engine"))

# When a refuted idea may come back, by the gate that failed (used when the checks give no `reopen`).
REOPEN_WHEN = {
    "correct": "the route produces the baseline's output tokens",
    "route": "the intended route runs without falling back",
    "faster": "a new compiler, target or workload could make the whole token faster beyond noise",
    "memory": "its peak memory fits the target's capacity",
}


_is_number = is_number   # (bounded: an integer too big for a float is no number here)


def _is_text(v: Any) -> bool:
    return isinstance(v, str) and v.strip() != ""


# Each checks key: the test its value must pass, and what the error says it must be.
_CHECK_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "expected_route": (_is_text, "a non-empty string"),
    "token_tolerance": (lambda v: _is_number(v) and 0 <= v <= 1, "a fraction between 0 and 1"),
    "threshold": (lambda v: _is_number(v) and 0 <= v < 1, "a fraction in [0, 1)"),
    "alpha": (lambda v: _is_number(v) and 0 < v < 1, "a probability strictly between 0 and 1"),
    "capacity_bytes": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer"),
    "token_floor_us": (lambda v: _is_number(v) and v > 0, "a positive number of µs"),
    "role_floors_us": (lambda v: isinstance(v, dict) and all(_is_text(k) and _is_number(x) and x > 0 for k, x in v.items()),
                       "an object of role -> positive µs"),
    "expressible": (lambda v: isinstance(v, bool), "true or false"),
    "expressible_reason": (_is_text, "a non-empty string"),
    "missing_capability": (_is_text, "a non-empty string"),
    "candidate_id": (_is_text, "a non-empty string"),
    "reopen": (_is_text, "a non-empty string"),
    "reference_tokens": (lambda v: isinstance(v, list) and len(v) > 0 and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v), "a non-empty list of token ids"),
    "reference_engine": (_is_text, "a non-empty string"),
}


@dataclass(frozen=True)
class Checks:
    """What the candidate is held to; the keys of the checks file (see the module docstring)."""
    expected_route: str | None = None
    token_tolerance: float = 0.0
    threshold: float = 0.01
    alpha: float = 0.05
    capacity_bytes: int | None = None
    token_floor_us: float | None = None
    role_floors_us: dict[str, float] = field(default_factory=dict)
    expressible: bool = True
    expressible_reason: str | None = None
    missing_capability: str | None = None
    candidate_id: str | None = None
    reopen: str | None = None
    reference_tokens: list[int] | None = None   # a reference engine's greedy tokens on the same prompt ids
    reference_engine: str | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str = "checks") -> Checks:
        if not isinstance(d, dict):
            raise BadInput(f"{where}: must be a JSON object")
        for key, value in d.items():
            if key not in _CHECK_KEYS:
                raise BadInput(f"{where}: unknown key {key!r} (known: {', '.join(_CHECK_KEYS)})")
            valid, what = _CHECK_KEYS[key]
            if not valid(value):
                raise BadInput(f"{where}: {key!r} must be {what}, not {value!r}")
        if d.get("expressible") is False and "expressible_reason" not in d:
            raise BadInput(f"{where}: 'expressible' is false but 'expressible_reason' does not say why")
        if ("reference_tokens" in d) != ("reference_engine" in d):
            raise BadInput(f"{where}: 'reference_tokens' and 'reference_engine' go together (the tokens, and the "
                           f"engine that decoded them)")
        return cls(**d)


def load_checks(path: str) -> Checks:
    return Checks.from_dict(load_json(path, "checks"), where=f"checks {path}")


def with_reference(checks: Checks, reference: Trace, candidates: list[Trace], where: str) -> Checks:
    """The checks holding the output to a reference engine's trace: its output tokens, decoded from the same
    prompt ids (the same model at the same depth) as every candidate."""
    engine = reference.environment.engine
    if not reference.output_tokens or not engine:
        raise BadInput(f"reference {where}: it records no output tokens, or no engine")
    for part, key in (("environment", "model_sha256"), ("workload", "context")):
        mine, theirs = getattr(getattr(reference, part), key), {getattr(getattr(c, part), key) for c in candidates}
        if mine is None or theirs != {mine}:
            raise BadInput(f"reference {where}: its {key} is {mine!r}, the candidate's {', '.join(map(repr, theirs))}: "
                           f"not the same model and prompt")
    return replace(checks, reference_tokens=list(reference.output_tokens), reference_engine=engine)


class Gate(NamedTuple):
    status: str       # PASS, FAIL or NO_EVIDENCE
    sentence: str     # what was found, with its numbers


@dataclass
class Effect:
    """The whole token, B against A: medians, relative change with its bootstrap interval, p-values."""
    baseline_median_us: float
    candidate_median_us: float
    relative_change: float      # (median B - median A) / median A; negative is faster
    ci_low: float
    ci_high: float
    confidence: float
    p_faster: float             # one-sided Mann-Whitney U: B's tokens shorter than A's
    p_slower: float

    def describe(self) -> str:
        return (f"median {self.baseline_median_us:,.1f} µs -> {self.candidate_median_us:,.1f} µs, "
                f"{self.relative_change:+.2%} ({self.confidence:.0%} interval {self.ci_low:+.2%} to "
                f"{self.ci_high:+.2%}), one-sided Mann-Whitney p(faster) = {self.p_faster:.3g}, "
                f"p(slower) = {self.p_slower:.3g}")


@dataclass
class Judgement:
    verdict: str
    reasons: list[str]
    gates: dict[str, Gate]      # empty when the evidence could not be read
    effect: Effect | None
    numbers: dict[str, Any]
    candidate_id: str
    scope: JudgedScope          # what the verdict applies to; the ledger records its as_json()
    reopen: str | None          # set for the verdicts that close an idea
    checked_against: str        # what the output was held to: "reference engine E", or the baseline's route only

    @property
    def measurement_error(self) -> bool:
        return any(r.startswith(MEASUREMENT_ERROR) for r in self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": self.reasons,
                "gates": {name: g._asdict() for name, g in self.gates.items()},
                "effect": asdict(self.effect) if self.effect else None, "numbers": self.numbers,
                "candidate_id": self.candidate_id, "scope": self.scope.as_json(), "reopen": self.reopen,
                "checked_against": self.checked_against}


def judge(baseline: Trace, candidate: Trace, checks: Checks = Checks()) -> Judgement:
    """The verdict on candidate B against baseline A. Pure: the same inputs give the same judgement."""
    problems = unreadable(baseline, candidate, checks)
    effect = None
    if not problems and min(len(baseline.token_wall_us), len(candidate.token_wall_us)) >= MIN_SAMPLES:
        effect = measure_effect(baseline.token_wall_us, candidate.token_wall_us, checks.alpha)
    gates = {} if problems else {
        "correct": correct_gate(baseline, candidate, checks.token_tolerance) if checks.reference_tokens is None
        else reference_gate(candidate, checks.reference_engine, checks.reference_tokens, checks.token_tolerance),
        "route": route_gate(candidate, checks.expected_route),
        "faster": faster_gate(effect, baseline, candidate, checks),
        "memory": memory_gate(candidate, checks.capacity_bytes),
        "switch": switch_gate(candidate),
    }
    verdict, reasons = _decide(baseline, candidate, checks, problems, gates)
    reopen = None
    if verdict in NEEDS_REOPEN:
        reopen = checks.reopen or _default_reopen(verdict, gates, checks)
    return Judgement(verdict=verdict, reasons=reasons, gates=gates, effect=effect,
                     numbers=_numbers(baseline, candidate, checks),
                     candidate_id=checks.candidate_id or str(candidate.route.label or "unlabelled"),
                     scope=scope_of(candidate), reopen=reopen, checked_against=checked_against(baseline, checks))


def judge_processes(baselines: list[Trace], candidates: list[Trace], checks: Checks = Checks()) -> Judgement:
    """The verdict on candidate B against baseline A, each measured in one or more processes: every baseline
    trace against every candidate trace, and the verdict they all give, told from the pair whose median token
    changed least; where the pairs' verdicts differ, inconclusive, told from the pair that changed least of those
    that do not promote (the evidence that holds the change back). One trace a side is judge() itself."""
    pairs = [judge(b, c, checks) for b in baselines for c in candidates]
    if len(pairs) == 1:
        return pairs[0]
    if unread := next((j for j in pairs if not j.gates), None):
        return unread
    verdicts = sorted({j.verdict for j in pairs})
    change = lambda j: j.effect.relative_change if j.effect else 0.0
    told = min((j for j in pairs if len(verdicts) == 1 or j.verdict != PROMOTE), key=lambda j: abs(change(j)))
    medians = lambda traces: [float(np.median(t.token_wall_us)) for t in traces]
    numbers = {**told.numbers, "pairs": len(pairs), "pair_verdicts": [j.verdict for j in pairs],
               "pair_changes": [change(j) for j in pairs],
               "baseline_process_medians_us": medians(baselines), "candidate_process_medians_us": medians(candidates)}
    if len(verdicts) == 1:
        return replace(told, numbers=numbers)
    counts = ", ".join(f"{v} in {sum(j.verdict == v for j in pairs)}" for v in verdicts)
    reasons = [f"the {len(pairs)} pairs of processes disagree ({counts}; the median token changed "
               f"{min(numbers['pair_changes']):+.2%} to {max(numbers['pair_changes']):+.2%})", *told.reasons]
    return replace(told, verdict=INCONCLUSIVE, reasons=reasons, numbers=numbers, reopen=None)


def _decide(baseline: Trace, candidate: Trace, checks: Checks, problems: list[str],
            gates: dict[str, Gate]) -> tuple[str, list[str]]:
    if problems:
        return ADAPTER_INCOMPLETE, problems
    if baseline.route == candidate.route:
        return DIAGNOSTIC, [f"the candidate ran the same route as the baseline ({candidate.route.label!r}, "
                            "same switch and settings): a measurement of noise, not a change",
                            gates["faster"].sentence]
    if not checks.expressible:
        return SEARCH_SPACE_INCOMPLETE, [f"the search space cannot express this candidate yet: {checks.expressible_reason}"]
    if failed := [g.sentence for g in gates.values() if g.status == FAIL]:
        return REFUTE, failed
    if missing := [g.sentence for g in gates.values() if g.status == NO_EVIDENCE]:
        return INCONCLUSIVE, missing
    passed = [g.sentence for g in gates.values()]
    if checks.missing_capability:
        return DEFER, [f"every gate passed, but the win waits on a missing capability: {checks.missing_capability}", *passed]
    return PROMOTE, passed


def unreadable(baseline: Trace, candidate: Trace, checks: Checks) -> list[str]:
    """Why the two traces cannot be compared safely; empty when they can."""
    problems = []
    sides = (("baseline", baseline), ("candidate", candidate))
    for name, trace in sides:
        if not trace.token_wall_us:
            problems.append(f"the {name} trace holds no whole-token samples")
    for part, key in SAME_WORKLOAD:
        a, b = (getattr(getattr(t, part), key) for t in (baseline, candidate))
        if a != b:
            problems.append(f"the traces measured different workloads: {key} is {a!r} in the baseline, "
                            f"{b!r} in the candidate")
    for name, trace in sides:
        problems += _below_floor(name, trace, checks)
    return problems


def _below_floor(name: str, trace: Trace, checks: Checks) -> list[str]:
    """Tokens (or a role's kernels within one token) measured faster than physics allows."""
    errors = []
    fastest = min(trace.token_wall_us, default=None)
    if fastest is not None and checks.token_floor_us is not None and fastest < checks.token_floor_us:
        below = sum(t < checks.token_floor_us for t in trace.token_wall_us)
        errors.append(f"{MEASUREMENT_ERROR} {below} of the {name}'s {len(trace.token_wall_us)} tokens are faster "
                      f"than the physics floor of {checks.token_floor_us:,.1f} µs (fastest {fastest:,.1f} µs)")
    role_us: dict[tuple[int, str], float] = defaultdict(float)
    for k in trace.kernels:
        if (role := role_of(k)) in checks.role_floors_us:
            role_us[k.token, role] += k.duration_us
    for (token, role), us in sorted(role_us.items()):
        if us < checks.role_floors_us[role]:
            errors.append(f"{MEASUREMENT_ERROR} {role} took {us:,.1f} µs in the {name}'s token {token}, "
                          f"below its floor of {checks.role_floors_us[role]:,.1f} µs")
    return errors


def _relative_median_change(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    median_a = np.median(a, axis=axis)
    return (np.median(b, axis=axis) - median_a) / median_a


def measure_effect(baseline_us: list[float], candidate_us: list[float], alpha: float) -> Effect:
    from scipy import stats      # here, not at the top: `profile` imports this module for PASS (0.5 s a process)
    a, b = np.asarray(baseline_us, dtype=float), np.asarray(candidate_us, dtype=float)
    interval = stats.bootstrap((a, b), _relative_median_change, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES,
                               confidence_level=1 - alpha, method="percentile",
                               rng=np.random.default_rng(BOOTSTRAP_SEED)).confidence_interval
    return Effect(baseline_median_us=float(np.median(a)), candidate_median_us=float(np.median(b)),
                  relative_change=float(_relative_median_change(a, b)),
                  ci_low=float(interval.low), ci_high=float(interval.high), confidence=1 - alpha,
                  p_faster=float(stats.mannwhitneyu(b, a, alternative="less").pvalue),
                  p_slower=float(stats.mannwhitneyu(b, a, alternative="greater").pvalue))


def _token_mismatch(baseline: Trace, candidate: Trace) -> tuple[int, int]:
    """(tokens differing, tokens compared); a length difference counts as differing tokens."""
    a, b = baseline.output_tokens or [], candidate.output_tokens or []
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b)), max(len(a), len(b))


def checked_against(baseline: Trace, checks: Checks) -> str:
    """What the correct gate held the candidate's output to."""
    if checks.reference_engine is not None:
        return f"reference engine {checks.reference_engine}"
    return f"the baseline's route only ({baseline.route.label or 'unlabelled'}): no reference engine"


def correct_gate(baseline: Trace, candidate: Trace, tolerance: float) -> Gate:
    for name, trace in (("baseline", baseline), ("candidate", candidate)):
        if not trace.output_tokens:
            return Gate(NO_EVIDENCE, f"the {name} trace records no output tokens, so correctness is unchecked")
    differing, compared = _token_mismatch(baseline, candidate)
    found = f"{differing} of {compared} output tokens differ from the baseline ({differing / compared:.1%})"
    if differing / compared > tolerance:
        return Gate(FAIL, f"the output changed: {found}, over the tolerance of {tolerance:.1%}")
    return Gate(PASS, f"the output is still correct: {found}, tolerance {tolerance:.1%} (checked against "
                      f"{checked_against(baseline, Checks())})")


def reference_gate(candidate: Trace, engine: str, reference: list[int], tolerance: float) -> Gate:
    """The candidate's greedy tokens against a reference engine's on the same prompt ids, over the steps both
    decoded (the engines' runs decode different numbers of tokens)."""
    out = candidate.output_tokens
    if not out:
        return Gate(NO_EVIDENCE, f"the candidate trace records no output tokens, so its output is unchecked "
                                 f"against reference engine {engine}")
    compared = min(len(out), len(reference))
    differing = [i for i, (a, b) in enumerate(zip(out, reference)) if a != b]
    found = (f"{len(differing)} of the {compared} greedy tokens both decoded differ from reference engine {engine}'s"
             + (f" (the first at step {differing[0]}: {out[differing[0]]} where {engine} gives "
                f"{reference[differing[0]]})" if differing else ""))
    if len(differing) / compared > tolerance:
        return Gate(FAIL, f"the output is not the reference's: {found}, over the tolerance of {tolerance:.1%}")
    return Gate(PASS, f"the output is still correct: {found}, tolerance {tolerance:.1%}")


def route_gate(candidate: Trace, expected: str | None) -> Gate:
    label = candidate.route.label
    if expected is None:
        return Gate(NO_EVIDENCE, "the checks declare no expected route, so nothing shows the intended route ran")
    if not label:
        return Gate(NO_EVIDENCE, "the candidate trace carries no route label, so nothing shows which route ran")
    if label != expected:
        return Gate(FAIL, f"the intended route did not run (a silent fallback): expected route {expected!r}, "
                          f"the trace's route label is {label!r}")
    return Gate(PASS, f"the intended route ran: route label {label!r}")


def faster_gate(effect: Effect | None, baseline: Trace, candidate: Trace, checks: Checks) -> Gate:
    if effect is None:
        return Gate(NO_EVIDENCE, f"too few whole-token samples to judge speed: {len(baseline.token_wall_us)} "
                                 f"baseline, {len(candidate.token_wall_us)} candidate (need {MIN_SAMPLES} each)")
    if effect.p_faster < checks.alpha and effect.ci_high <= -checks.threshold:
        return Gate(PASS, f"the whole token is faster beyond noise: {effect.describe()}")
    if effect.p_slower < checks.alpha and effect.ci_low >= checks.threshold:
        return Gate(FAIL, f"the whole token is slower beyond noise: {effect.describe()}")
    return Gate(NO_EVIDENCE, f"the change is inside noise: {effect.describe()} (a verdict needs p < "
                             f"{checks.alpha:g} and the whole interval beyond {checks.threshold:.1%})")


def memory_gate(candidate: Trace, capacity_bytes: int | None) -> Gate:
    # trace.load has checked both are byte counts or null
    peak = candidate.memory.peak_bytes
    capacity = capacity_bytes if capacity_bytes is not None else candidate.memory.capacity_bytes
    if peak is None:
        return Gate(NO_EVIDENCE, "the candidate trace records no peak memory, so the fit on the target is unchecked")
    if capacity is None:
        return Gate(NO_EVIDENCE, "neither the checks nor the candidate trace give the target's memory capacity")
    found = f"peak {peak:,} bytes against a capacity of {capacity:,} bytes ({peak / capacity:.1%})"
    if peak > capacity:
        return Gate(FAIL, f"memory does not fit on the target: {found}")
    return Gate(PASS, f"memory fits on the target: {found}")


def switch_gate(candidate: Trace) -> Gate:
    switch = candidate.route.switch
    if not _is_text(switch):
        return Gate(NO_EVIDENCE, "the candidate's route names no switch that turns it off")
    return Gate(PASS, f"one switch turns it off: {switch}")


def _default_reopen(verdict: str, gates: dict[str, Gate], checks: Checks) -> str:
    if verdict == SEARCH_SPACE_INCOMPLETE:
        return f"when the search space can express it ({checks.expressible_reason})"
    when = {**REOPEN_WHEN, **({"correct": f"the route produces reference engine {checks.reference_engine}'s output "
                                          f"tokens"} if checks.reference_engine else {})}
    return "when " + "; or when ".join(when[name] for name, g in gates.items() if g.status == FAIL)


def _numbers(baseline: Trace, candidate: Trace, checks: Checks) -> dict[str, Any]:
    differing, compared = _token_mismatch(baseline, candidate)
    return {"baseline_samples": len(baseline.token_wall_us), "candidate_samples": len(candidate.token_wall_us),
            "baseline_fastest_us": min(baseline.token_wall_us, default=None),
            "candidate_fastest_us": min(candidate.token_wall_us, default=None),
            "token_floor_us": checks.token_floor_us, "threshold": checks.threshold, "alpha": checks.alpha,
            "output_tokens_compared": compared, "output_tokens_differing": differing,
            "token_tolerance": checks.token_tolerance,
            "peak_bytes": candidate.memory.peak_bytes,
            "capacity_bytes": checks.capacity_bytes if checks.capacity_bytes is not None
            else candidate.memory.capacity_bytes}


def scope_of(trace: Trace) -> JudgedScope:
    """What a verdict on this trace applies to: model, target, workload, compiler and its version."""
    env, workload = trace.environment, trace.workload
    return JudgedScope(model_sha256=env.model_sha256, target=env.device, context=workload.context,
                       batch=workload.batch, compiler=env.compiler, compiler_version=env.compiler_version)
