"""search.json: what a search found, as typed records with their keys defined once.

Written by `boltbeam search`, read back by `boltbeam report --search` (the funnel) and
`boltbeam search-calibrate` (each kernel's work). A file read back is checked field by field: one that
is not a summary is one BadInput line.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput
from boltbeam.files import load_json
from boltbeam.search.decide import Search, spearman_by_kind, spearman_within_kernels

MAX_COUNT = 10**15


@dataclass(frozen=True)
class KernelSummary:
    kernel: str                 # kernel key
    name: str
    launches: int
    legal: int
    settings: int
    survivors: int
    timed: int
    default_us: float
    best_us: float
    floor_us: float
    choice: dict[str, int] | None
    output: int | None = None
    reduce: int | None = None
    outputs: int | None = None
    bytes: int | None = None
    flops: int | None = None


@dataclass(frozen=True)
class SpaceSummary:
    settings: int
    legal: int
    survivors: int
    foreseen_out: int
    token_product_log10: float
    legal_token_product_log10: float
    rejected_by_reason: dict[str, int]


@dataclass(frozen=True)
class SearchSummary:
    route: str
    seconds: float
    seconds_timing: float
    kernels: int
    launches_per_token: int
    space: SpaceSummary
    timed_now: int
    reused_from_ledger: int
    refused_by_compiler: int
    spearman: dict[str, dict[str, Any]]            # kind -> {rho, points}
    spearman_within_kernels: dict[str, Any]        # {median_rho, kernels}
    futuresight: dict[str, Any]                    # the constants it ran with
    routed_kernels: int
    search_space_incomplete: list[str]
    unbuilt: dict[str, str]
    per_kernel: list[KernelSummary]
    judgement: dict[str, Any] | None = None
    judge_refused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, path: str) -> "SearchSummary":
        return from_dict(load_json(path, "search summary"), f"search summary {path}")


def summarize(result: Search, target: Target, seconds: float, route: Path, judgement=None,
              judge_refused: str | None = None) -> SearchSummary:
    rejected: Counter = Counter()
    for k in result.kernels:
        rejected.update(k.space.rejected)
    sizes = [k.space.size for k in result.kernels]
    legal = [len(k.space.legal) for k in result.kernels]
    rho, n = spearman_within_kernels(result, target)
    return SearchSummary(
        route=str(route), seconds=seconds, seconds_timing=result.seconds_timing, kernels=len(result.kernels),
        launches_per_token=sum(k.launches for k in result.kernels),
        space=SpaceSummary(sum(sizes), sum(legal), sum(k.survivors for k in result.kernels),
                           sum(k.foreseen_out for k in result.kernels), sum(math.log10(s) for s in sizes if s),
                           sum(math.log10(x) for x in legal if x), dict(rejected.most_common())),
        timed_now=result.timed_now, reused_from_ledger=result.reused,
        refused_by_compiler=sum(len(k.refused) for k in result.kernels),
        spearman={kind: {"rho": r, "points": p} for kind, (r, p) in spearman_by_kind(result).items()},
        spearman_within_kernels={"median_rho": rho, "kernels": n}, futuresight=asdict(result.calibration),
        routed_kernels=len(result.route.choices),
        search_space_incomplete=[k.name for k in result.kernels if k.incomplete], unbuilt=result.unbuilt,
        per_kernel=[KernelSummary(
            k.key, k.name, k.launches, len(k.space.legal), k.space.size, k.survivors, len(k.timed),
            k.default.measured_us, k.best_us, k.floor_us, k.choice.setting if k.choice else None,
            k.space.kernel.output, k.space.kernel.reduce, k.space.kernel.outputs, k.work.bytes, k.work.flops)
            for k in result.kernels],
        judgement=judgement.to_dict() if judgement else None, judge_refused=judge_refused)


# --- reading one back ------------------------------------------------------------------------------

def _count(x: Any, what: str, where: str, optional: bool = False) -> int | None:
    if optional and x is None:
        return None
    if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < MAX_COUNT:
        raise BadInput(f"{where}: {what} must be a count, not {x!r}")
    return x


def _number(x: Any, what: str, where: str) -> float:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x) or x < 0:
        raise BadInput(f"{where}: {what} must be a non-negative number, not {x!r}")
    return float(x)


def _names(x: Any, what: str, where: str) -> list[str]:
    if x is not None and not (isinstance(x, list) and all(isinstance(n, str) for n in x)):
        raise BadInput(f"{where}: {what} must be a list of kernel names")
    return x or []


def _kernel(k: Any, where: str) -> KernelSummary:
    if not isinstance(k, dict):
        raise BadInput(f"{where}: a per_kernel entry must be an object")
    choice = k.get("choice")
    if choice is not None and not (isinstance(choice, dict) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in choice.values())):
        raise BadInput(f"{where}: a kernel's choice must map names to integers")
    return KernelSummary(
        str(k.get("kernel", "")), str(k.get("name", "")), _count(k.get("launches"), "launches", where),
        _count(k.get("legal"), "legal", where), _count(k.get("settings"), "settings", where),
        _count(k.get("survivors"), "survivors", where), _count(k.get("timed"), "timed", where),
        _number(k.get("default_us"), "default_us", where), _number(k.get("best_us"), "best_us", where),
        _number(k.get("floor_us"), "floor_us", where), choice,
        *(_count(k.get(f), f, where, optional=True) for f in ("output", "reduce", "outputs", "bytes", "flops")))


def from_dict(d: Any, where: str) -> SearchSummary:
    if not isinstance(d, dict) or not isinstance(d.get("space"), dict) or not isinstance(d.get("per_kernel"), list):
        raise BadInput(f"{where}: not a `boltbeam search` summary (no space or per_kernel)")
    sp = d["space"]
    reasons = sp.get("rejected_by_reason", {})
    if not isinstance(reasons, dict):
        raise BadInput(f"{where}: rejected_by_reason must be an object")
    space = SpaceSummary(_count(sp.get("settings"), "settings", where), _count(sp.get("legal"), "legal", where),
                         _count(sp.get("survivors"), "survivors", where),
                         _count(sp.get("foreseen_out", 0), "foreseen_out", where),
                         _number(sp.get("token_product_log10", 0), "token_product_log10", where),
                         _number(sp.get("legal_token_product_log10", 0), "legal_token_product_log10", where),
                         {str(k): _count(v, "a rejection count", where) for k, v in reasons.items()})
    if not space.settings >= space.legal >= space.survivors:
        raise BadInput(f"{where}: the space must narrow (settings >= legal >= survivors)")
    per_kernel = [_kernel(k, where) for k in d["per_kernel"]]
    dicts = {key: d.get(key) if isinstance(d.get(key), dict) else {} for key in
             ("spearman", "spearman_within_kernels", "futuresight", "unbuilt")}
    return SearchSummary(
        str(d.get("route", "")), _number(d.get("seconds", 0), "seconds", where),
        _number(d.get("seconds_timing", 0), "seconds_timing", where), len(per_kernel),
        _count(d.get("launches_per_token", 0), "launches_per_token", where), space,
        _count(d.get("timed_now", 0), "timed_now", where), _count(d.get("reused_from_ledger", 0), "reused_from_ledger", where),
        _count(d.get("refused_by_compiler", 0), "refused_by_compiler", where), dicts["spearman"],
        dicts["spearman_within_kernels"], dicts["futuresight"], _count(d.get("routed_kernels"), "routed_kernels", where),
        _names(d.get("search_space_incomplete"), "search_space_incomplete", where),
        {str(k): str(v) for k, v in dicts["unbuilt"].items()},
        per_kernel, d.get("judgement") if isinstance(d.get("judgement"), dict) else None,
        d.get("judge_refused") if isinstance(d.get("judge_refused"), str) else None)
