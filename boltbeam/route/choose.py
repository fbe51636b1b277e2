"""The search for a generated-layout family: which setting of the repacked layout should a model run?

BubbleBeam's part: the family's settings from data/spaces.toml (it has no rule in chip facts, so every
setting is legal). FutureSight's part: each setting's bytes per token (values, scales and offsets of
every layer the layout takes, plus a factored gemv's partial sums written and read back) over the
target's bandwidth, plus the products it launches times the target's measured cost a kernel (stacked
layers launch one product for several), which orders them; the budget keeps the best predicted.
BoltBeam's part: each kept setting runs the whole token in a fresh process, on tinygrad's heuristics
or with its BEAM search as the baseline did, the judge holds it against the baseline route (greedy
tokens, the intended route, faster beyond noise), and every verdict, refuted ones included, goes in
the ledger with its reason; a setting the ledger refuted in the same scope is not run again until its
reopen condition holds.
"""
from __future__ import annotations

import itertools
from statistics import median
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.judge.judge import Checks, judge
from boltbeam.measure import trace as tracefile
from boltbeam.measure.route import LAYOUT_LABEL, Route, engine, routed_label
from boltbeam.measure.tinygrad_run import profile_elsewhere
from boltbeam.route.layout import FAMILY, FORMS, SCALE_BYTES, STACKS, Setting, stacks, values_of
from boltbeam.search.space import families

PARTIAL_BYTES = 4     # a factored gemv's partial sum per row and group, fp32, written then read
PER_KERNEL_FACT = "launch_sync_per_kernel"    # the target's measured cost of one more kernel in a token


@dataclass
class Candidate:
    setting: Setting
    predicted_bytes: int
    predicted_us: float
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    median_us: float | None = None
    skipped: str | None = None     # why the ledger kept it from running

    @property
    def flag(self) -> str:
        return self.setting.flag


@dataclass
class LayoutChoice:
    baseline_median_us: float
    candidates: list[Candidate]
    chosen: Candidate | None

    def to_dict(self) -> dict[str, Any]:
        return {"family": FAMILY, "baseline_median_us": self.baseline_median_us,
                "chosen": self.chosen.flag if self.chosen else None,
                "candidates": [{**asdict(c), "setting": c.flag} for c in self.candidates]}


def settings() -> list[Setting]:
    """Every setting the family declares (BubbleBeam: no rule in chip facts rejects any)."""
    space = families()[FAMILY].parameters
    by_bytes = {b: d for d, b in SCALE_BYTES.items()}
    return [Setting(by_bytes[b], FORMS[f], STACKS[st])
            for b, f, st in itertools.product(space["scale_bytes"], space["factored"], space["stacked"])]


def _taken(t) -> bool:
    """A layer the layout repacks: a 2-D table in a format it describes, not the embedding lookup."""
    return len(t.shape) == 2 and values_of(t.format) is not None and t.role not in (None, "token_embd")


def predicted_bytes(census, setting: Setting) -> int:
    """Bytes one token reads with the layout: each layer it takes as planes (an offset plane counted
    for every group: at most), every other tensor as the census has it."""
    total = 0
    for t in census.tensors:
        if not _taken(t):
            total += 0 if t.tied else t.bytes_per_token
            continue
        v = values_of(t.format)
        cols, rows = t.shape
        groups = rows * cols // v.group
        total += rows * cols * v.bits // 8 + groups * 2 * SCALE_BYTES[setting.scale_dtype]
        if setting.form == "factored":
            total += 2 * groups * PARTIAL_BYTES
    return total


def predicted_products(census, setting: Setting) -> int:
    """Kernels one token launches for the layers the layout takes: one a layer, or a stack when the
    stack is on; a factored product needs two."""
    taken = [t for t in census.tensors if _taken(t)]
    products = len(stacks(taken)) if setting.stack == "stacked" else len(taken)
    return products * (2 if setting.form == "factored" else 1)


def predicted_us(census, setting: Setting, target: Target) -> float:
    per_kernel_s = target.fact(PER_KERNEL_FACT) or 0.0
    return (predicted_bytes(census, setting) / target.bandwidth + predicted_products(census, setting) * per_kernel_s) * 1e6


def baseline_of(path: str, sha: str, device: str, context: int, beam: int):
    """A baseline trace profiled earlier: the default route of this model and device at this depth and
    BEAM width, or one clear line on what differs."""
    base = tracefile.load(path)
    route, env, work = base.route, base.environment, base.workload
    problems = [what for what, bad in (
        ("another model", env.get("model_sha256") not in (None, sha)),
        (f"device {env.get('device')}", env.get("device") != device),
        (f"context {work.get('context')}", work.get("context") != context),
        (f"BEAM width {route.get('settings', {}).get('beam', 0)}", route.get("settings", {}).get("beam", 0) != beam),
        (f"route {route.get('label')!r}", route.get("label") != (f"tinygrad-beam-{beam}" if beam else "tinygrad-scheduler")),
    ) if bad]
    if problems:
        raise BadInput(f"baseline {path}: ran {', '.join(problems)}; the search needs the default route of this model "
                       f"on {device} at context {context}" + (f" with --beam {beam}" if beam else ""))
    return base


def choose(model: str, census, device: str, context: int, tokens: int, target: Target, ledger, sha: str,
           out: Path, say: Callable[[str], None] = lambda s: None, beam: int = 0, budget: int | None = None,
           baseline: tuple[str, Any] | None = None) -> LayoutChoice:
    """Judge the `budget` best predicted settings on the whole token against the default route (with
    BEAM width `beam` on both sides; profiled here unless `baseline` is (path, trace) of it, from
    baseline_of); the fastest promoted one wins."""
    flags = ["--context", str(context), "--tokens", str(tokens), "--beam", str(beam)]
    if baseline is None:
        say("the whole token on the default route")
        path = str(out / "baseline.json")
        if failed := profile_elsewhere(model, device, path, *flags, "--route", "none"):
            raise Refused(f"profiling the default route failed: {failed}")
        baseline = path, tracefile.load(path)
    baseline, base = baseline
    candidates = sorted((Candidate(s, predicted_bytes(census, s), predicted_us(census, s, target)) for s in settings()),
                        key=lambda c: c.predicted_us)
    scope = {"device": device, "target": target.name, "engine": engine(), "family": FAMILY, "model_sha256": sha,
             "beam": beam}
    rest = f"tinygrad-beam-{beam}" if beam else "tinygrad-scheduler"
    tried = 0
    for c in candidates:
        candidate_id = f"{FAMILY} {c.flag}"
        skip, why = ledger.should_skip(candidate_id, {**scope, "setting": c.flag})
        if skip:
            c.skipped = why
            continue
        if budget is not None and tried >= budget:
            c.skipped = f"beyond the budget: FutureSight kept the {budget} best predicted setting(s)"
            continue
        tried += 1
        say(f"the whole token on the layout {c.flag}")
        path = out / f"layout_{c.flag.replace(':', '_')}.json"
        if failed := profile_elsewhere(model, device, str(path), *flags, "--route", "none", "--layout", c.flag):
            raise Refused(f"profiling the layout {c.flag} failed: {failed}")
        trace = tracefile.load(str(path))
        j = judge(base, trace, Checks(expected_route=routed_label([LAYOUT_LABEL], rest), candidate_id=candidate_id,
                                      reopen=f"engine!={engine()}"))
        c.verdict, c.reasons = j.verdict, j.reasons
        c.median_us = median(trace.token_wall_us)
        ledger.append(candidate=candidate_id, verdict=j.verdict, reasons=j.reasons, scope={**j.scope, **scope,
                      "setting": c.flag, "predicted_us": c.predicted_us}, evidence=[baseline, str(path)],
                      reopen=j.reopen, actor="boltbeam search")
    promoted = [c for c in candidates if c.verdict == "promote"]
    chosen = min(promoted, key=lambda c: c.median_us) if promoted else None
    return LayoutChoice(median(base.token_wall_us), candidates, chosen)


def route_of(choice: LayoutChoice, sha: str, device: str, target: str, beam: int = 0) -> Route | None:
    """The route file for the chosen setting: the layout, no per-kernel opts (tinygrad's heuristics, or
    its BEAM search at the width the setting was judged with)."""
    if choice.chosen is None:
        return None
    return Route(sha, engine(), device, target, FAMILY, "generated by search", [], layout=asdict(choice.chosen.setting),
                 beam=beam)

