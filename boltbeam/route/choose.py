"""The search for a generated-layout family: which setting of the repacked layout should a model run?

BubbleBeam's part: the family's settings from data/spaces.toml (it has no rule in chip facts, so every
setting is legal). FutureSight's part: each setting's bytes per token (values, scales and offsets of
every layer the layout takes, plus a factored gemv's partial sums written and read back) over the
target's bandwidth, which orders them. BoltBeam's part: each setting runs the whole token in a fresh
process, the judge holds it against the default route (greedy tokens, the intended route, faster
beyond noise), and every verdict, refuted ones included, goes in the ledger with its reason; a
setting the ledger refuted in the same scope is not run again until its reopen condition holds.
"""
from __future__ import annotations

import itertools
from statistics import median
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from boltbeam.bound.targets import Target
from boltbeam.errors import Refused
from boltbeam.judge.judge import Checks, judge
from boltbeam.measure import trace as tracefile
from boltbeam.measure.route import LAYOUT_LABEL, Route, engine, routed_label
from boltbeam.measure.tinygrad_run import profile_elsewhere
from boltbeam.route.layout import FAMILY, FORMS, SCALE_BYTES, Setting, values_of
from boltbeam.search.space import families

PARTIAL_BYTES = 4     # a factored gemv's partial sum per row and group, fp32, written then read


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
        return f"{self.setting.scale_dtype}:{self.setting.form}"


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
    return [Setting(by_bytes[b], FORMS[f]) for b, f in itertools.product(space["scale_bytes"], space["factored"])]


def predicted_bytes(census, setting: Setting) -> int:
    """Bytes one token reads with the layout: each layer it takes as planes (an offset plane counted
    for every group: at most), every other tensor as the census has it."""
    total = 0
    for t in census.tensors:
        v = values_of(t.format) if len(t.shape) == 2 else None
        if v is None or t.role in (None, "token_embd"):
            total += 0 if t.tied else t.bytes_per_token
            continue
        cols, rows = t.shape
        groups = rows * cols // v.group
        total += rows * cols * v.bits // 8 + groups * 2 * SCALE_BYTES[setting.scale_dtype]
        if setting.form == "factored":
            total += 2 * groups * PARTIAL_BYTES
    return total


def choose(model: str, census, device: str, context: int, tokens: int, target: Target, ledger, sha: str,
           out: Path, say: Callable[[str], None] = lambda s: None) -> LayoutChoice:
    """Judge every setting on the whole token against the default route; the fastest promoted one wins."""
    flags = ["--context", str(context), "--tokens", str(tokens)]
    say("the whole token on the default route")
    if failed := profile_elsewhere(model, device, str(out / "baseline.json"), *flags, "--route", "none"):
        raise Refused(f"profiling the default route failed: {failed}")
    base = tracefile.load(str(out / "baseline.json"))
    bandwidth = target.bandwidth
    candidates = sorted((Candidate(s, b := predicted_bytes(census, s), b / bandwidth * 1e6) for s in settings()),
                        key=lambda c: c.predicted_us)
    scope = {"device": device, "target": target.name, "engine": engine(), "family": FAMILY, "model_sha256": sha}
    for c in candidates:
        candidate_id = f"{FAMILY} {c.flag}"
        skip, why = ledger.should_skip(candidate_id, {**scope, "setting": c.flag})
        if skip:
            c.skipped = why
            continue
        say(f"the whole token on the layout {c.flag}")
        path = out / f"layout_{c.flag.replace(':', '_')}.json"
        if failed := profile_elsewhere(model, device, str(path), *flags, "--route", "none", "--layout", c.flag):
            raise Refused(f"profiling the layout {c.flag} failed: {failed}")
        trace = tracefile.load(str(path))
        j = judge(base, trace, Checks(expected_route=routed_label([LAYOUT_LABEL], "tinygrad-scheduler"), candidate_id=candidate_id,
                                      reopen=f"engine!={engine()}"))
        c.verdict, c.reasons = j.verdict, j.reasons
        c.median_us = median(trace.token_wall_us)
        ledger.append(candidate=candidate_id, verdict=j.verdict, reasons=j.reasons, scope={**j.scope, **scope,
                      "setting": c.flag, "predicted_us": c.predicted_us}, evidence=[str(out / "baseline.json"), str(path)],
                      reopen=j.reopen, actor="boltbeam search")
    promoted = [c for c in candidates if c.verdict == "promote"]
    chosen = min(promoted, key=lambda c: c.median_us) if promoted else None
    return LayoutChoice(median(base.token_wall_us), candidates, chosen)


def route_of(choice: LayoutChoice, sha: str, device: str, target: str) -> Route | None:
    """The route file for the chosen setting: the layout, no per-kernel opts (tinygrad's heuristics)."""
    if choice.chosen is None:
        return None
    return Route(sha, engine(), device, target, FAMILY, "generated by search", [], layout=asdict(choice.chosen.setting))

