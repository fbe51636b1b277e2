"""The search for a family judged on the whole token (the repacked layout, split attention, the gemv
geometry of the layout's generated kernel): which of its settings should a model run?

Every generated family is searched here, through its declaration (route/families.py), never by name.
BubbleBeam's part: the family's settings from data/spaces.toml that its rules, written in chip facts,
allow on the target (the layout and split attention have none; a geometry's threads must fill whole
thread groups and fit the group's limits), the rest counted by the rule they break. FutureSight's
part, each family's own term (its module's `foresee`): each setting's bytes per token, moved at the
rate its kernels can reach, plus the kernels it launches times the target's measured cost a kernel,
which orders them; the budget keeps the best predicted.

BoltBeam's part: each kept setting runs the whole token in a fresh process, on a route (`on`) or on
tinygrad's own, with its heuristics or its BEAM search as the baseline ran,
the judge holds it against the baseline (greedy tokens, the intended route, faster beyond noise),
and every verdict, refuted ones included, goes in the ledger with its reason; a setting the ledger
refuted in the same scope is not run again until its reopen condition holds.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from statistics import median
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from boltbeam import switches
from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.judge.judge import Checks, judge, judge_processes
from boltbeam.judge.scope import ScopeKey
from boltbeam.judge.verdicts import INCONCLUSIVE
from boltbeam.ledger.reopen import unless
from boltbeam.measure import trace as tracefile
from boltbeam.measure.trace import Trace
from boltbeam.measure.route import LAYOUT_LABEL, Route, engine, routed_label
from boltbeam.measure.tinygrad_run import profile_elsewhere
from boltbeam.route import gemv
from boltbeam.route.families import BY_NAME, labels, of_route, unmet
from boltbeam.route.family import Family
from boltbeam.route.gemv import Geometry
from boltbeam.route.layout import WRITTEN_BY, Setting
from boltbeam.search import alone as alone_timing
from boltbeam.foresight.future import Calibration, calibration
from boltbeam.foresight.space import families, on_target

WHOLE_TOKEN = BY_NAME     # the families judged on the whole token: every generated one
BEYOND_BUDGET = "beyond the budget"     # a setting not judged: past the --budget best predicted (the reason's start)
OUT_OF_TIME = "out of time: the time budget was spent before it started"
ROUTE_OWN = "the route's own setting: the baseline"
EXCLUDED = "judged already, on an earlier route"     # choose's exclude: tune's later rounds


@dataclass
class Candidate:
    setting: Any
    predicted_bytes: int
    predicted_kernels: int
    predicted_us: float
    predicted_terms: tuple[str, ...] = ()
    predicted_fraction: float = 1.0
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    median_us: float | None = None
    skipped: str | None = None     # why it did not run: the ledger or the budget
    trace: str | None = None       # its whole-token profile
    ledger_id: int | None = None   # the ledger entry of its verdict
    recalled: bool = False         # its verdict read from the ledger (recall), not timed again
    before_us: float | None = None          # the baseline's median token over the processes its verdict was judged on
    sides: tuple[int, int] | None = None    # the processes its verdict was judged on: the baseline's, its own

    @property
    def flag(self) -> str:
        return self.setting.flag


@dataclass(frozen=True)
class Reference:
    """A reference engine's greedy tokens on the prompt ids every profile decodes: what "output still correct"
    holds a setting to, in place of the route it goes on."""
    engine: str
    output_tokens: list[int]


@dataclass(frozen=True)
class TokenScope:
    """A whole token run on a route: the model, device, engine, BEAM width, depth and tokens, and what the route
    sets of each whole-token family (route_settings). tune finds the profile of a route in the ledger by it."""
    model_sha256: str
    device: str
    engine: str
    beam: int
    context: int
    tokens: int
    route: dict[str, Any] | None
    processes: int = 1        # a side's processes (judge_processes); one is null, as a ledger older than the key reads
    decisive: float = 0.0     # a first pair's change that settles a verdict (settled; 0: every process runs); null
                              # where off or one process a side

    def as_json(self) -> dict[str, Any]:
        several = self.processes > 1
        return {ScopeKey.DEVICE: self.device, ScopeKey.ENGINE: self.engine, ScopeKey.MODEL_SHA256: self.model_sha256,
                ScopeKey.BEAM: self.beam, ScopeKey.CONTEXT: self.context, ScopeKey.TOKENS: self.tokens,
                ScopeKey.ROUTE: self.route, ScopeKey.PROCESSES: self.processes if several else None,
                ScopeKey.DECISIVE: self.decisive if several and self.decisive > 0 else None}


@dataclass(frozen=True)
class FamilyScope:
    """What a verdict on one of a family's settings holds for: the whole token it ran, the target, the family, the
    label of the route it went on and the reference its output was held to (None: the route's own tokens)."""
    token: TokenScope
    target: str
    family: str
    on: str
    reference: Reference | None

    def of(self, setting: str) -> dict[str, Any]:
        """The scope of one setting (its flag): the ledger's key for its verdict."""
        return self.token.as_json() | {
            ScopeKey.TARGET: self.target, ScopeKey.FAMILY: self.family, ScopeKey.ON: self.on,
            ScopeKey.REFERENCE: asdict(self.reference) if self.reference else None, ScopeKey.SETTING: setting}


@dataclass
class Choice:
    family: str
    baseline_median_us: float | None     # None: no setting ran or was recalled, so the baseline was not needed
    candidates: list[Candidate]
    chosen: Candidate | None
    rejected: dict[str, int] = field(default_factory=dict)    # settings a rule in chip facts (BubbleBeam) or the model rejects, by rule
    alone: list[alone_timing.Product] = field(default_factory=list)   # gemv: each product's geometries timed alone

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "baseline_median_us": self.baseline_median_us,
                "chosen": self.chosen.flag if self.chosen else None,
                "chosen_trace": self.chosen.trace if self.chosen else None, "rejected_by_reason": self.rejected,
                "candidates": [{**asdict(c), "setting": c.flag} for c in self.candidates],
                **({"alone": [asdict(p) for p in self.alone]} if self.alone else {})}


def measured_fraction(path: str, target: Target) -> tuple[str, float]:
    """How the products of the layout profiled at `path` were written, and the fraction of the target's
    bandwidth they reached: the planes' bytes (each read once a token) over the per-token median of
    the weight regions' kernel time."""
    from boltbeam.account.compare import region_times
    from boltbeam.route.layout import PRODUCTS
    trace = tracefile.load(path)
    layout = trace.route.settings.get("families", {}).get(LAYOUT_LABEL)
    if not layout or layout.get("form") not in WRITTEN_BY or not layout.get("bytes"):
        raise BadInput(f"trace {path}: ran no layout whose form and bytes it records")
    times = region_times(trace)
    us = sum(times[r] for r in PRODUCTS.regions)
    if not us > 0:
        raise BadInput(f"trace {path}: no kernel time on a weight's role")
    return WRITTEN_BY[layout["form"]], layout["bytes"] / (us * 1e-6) / target.bandwidth


def with_setting(family: Family, on: Route | None, setting, sha: str, device: str, target: str,
                 beam: int) -> Route:
    """The route that runs `on` (or tinygrad's own) with the family at this setting, at BEAM width `beam`."""
    if on is None:
        on = Route(sha, engine(), device, target, family.name, "generated by search", [])
    return dataclasses.replace(on, beam=beam, families={**on.families, family.key: setting.stored()})


def label_of(on: Route | None, beam: int, families: list[str] | None = None) -> str:
    """The route label of a run on the route `on` (its families, unless `families` names others) or on
    tinygrad's own scheduler or BEAM."""
    rest = "boltbeam-search" if on else f"tinygrad-beam-{beam}" if beam else "tinygrad-scheduler"
    return routed_label(families if families is not None else labels(on.families) if on else [], rest)


def baseline_of(path: str, sha: str, device: str, context: int, beam: int, on: Route | None = None):
    """A baseline trace profiled earlier: this model and device at this depth and BEAM width, on the
    route `on` (or tinygrad's own), or one clear line on what differs."""
    base = tracefile.load(path)
    route, env, work = base.route, base.environment, base.workload
    label = label_of(on, beam)
    problems = [what for what, bad in (
        ("another model", env.model_sha256 not in (None, sha)),
        (f"device {env.device}", env.device != device),
        (f"context {work.context}", work.context != context),
        (f"BEAM width {route.settings.get('beam', 0)}", route.settings.get("beam", 0) != beam),
        (f"route {route.label!r}", route.label != label),
    ) if bad]
    if problems:
        raise BadInput(f"baseline {path}: ran {', '.join(problems)}; the search needs route {label!r} of this model "
                       f"on {device} at context {context}" + (f" with --beam {beam}" if beam else ""))
    return base


@dataclass(frozen=True)
class Side:
    """One side of a verdict: its first process's trace file (the others beside it, process_paths) and the flags of
    `boltbeam profile` that make another of its processes."""
    path: str
    flags: tuple[str, ...]


def profile_and_judge(model: str, device: str, ledger, candidate_id: str, key: dict[str, Any], baseline: Side,
                      candidate: Side, processes: int, workers: int, decisive: float, expected_route: str,
                      reference: Reference | None, actor: str, ran: Callable[[], None], what: str):
    """The candidate profiled and judged against the baseline (whose first process has run): first a batch of the
    candidate's processes (first_batch); where that settles the verdict (settled), it is judged on the processes
    run, else the rest of both sides run first (the baseline's that have not). Returns judge_sides' answer and the
    processes each side ran."""
    batch = first_batch(processes, workers, decisive)
    profile_side(model, device, candidate.path, processes, ran, what, *candidate.flags, workers=workers, last=batch)
    checks = _checks(candidate_id, expected_route, reference)
    if batch == processes or not settled(side(baseline.path, processes), side(candidate.path, processes), checks,
                                         decisive):
        profile_side(model, device, baseline.path, processes, ran, "the baseline", *baseline.flags, workers=workers,
                     first=present(baseline.path, processes))
        profile_side(model, device, candidate.path, processes, ran, what, *candidate.flags, workers=workers,
                     first=batch)
    sides = (present(baseline.path, processes), present(candidate.path, processes))
    return (*judge_sides(ledger, candidate_id, key, baseline.path, candidate.path, processes, expected_route,
                         reference, actor), sides)


def _checks(candidate_id: str, expected_route: str, reference: Reference | None) -> Checks:
    return Checks(expected_route=expected_route, candidate_id=candidate_id, reopen=unless(ScopeKey.ENGINE, engine()),
                  reference_tokens=reference.output_tokens if reference else None,
                  reference_engine=reference.engine if reference else None)


def judge_sides(ledger, candidate_id: str, key: dict[str, Any], baseline: str, candidate: str, processes: int,
                expected_route: str, reference: Reference | None, actor: str):
    """One setting's verdict: every process of the baseline side (its first file `baseline`) against every process of
    the candidate's that ran (judge_processes), its output held to the reference's tokens where given, recorded in the
    ledger with `key` and both sides' medians over their processes. Returns the judgement, those medians and the
    entry's id."""
    bases, traces = side(baseline, processes), side(candidate, processes)
    j = judge_processes(bases, traces, _checks(candidate_id, expected_route, reference))
    before, after = pooled_median(bases), pooled_median(traces)
    ledger_id = ledger.append(candidate=candidate_id, verdict=j.verdict, reasons=j.reasons, scope={
        **j.scope.as_json(), **key, ScopeKey.MEDIAN_US: after, ScopeKey.BASELINE_MEDIAN_US: before},
        evidence=evidence(baseline, candidate, processes), reopen=j.reopen, actor=actor)
    return j, before, after, ledger_id


def evidence(baseline: str, candidate: str, processes: int) -> list[str]:
    """A verdict's files for the ledger: the baseline's first process, the candidate's first (what a later run reads
    back as the candidate's trace), then every other process's file of each side."""
    bases, candidates = (process_paths(p, processes) for p in (baseline, candidate))
    return [bases[0], candidates[0], *(p for p in bases[1:] + candidates[1:] if Path(p).is_file())]


def sides_of(evidence: list[dict[str, Any]]) -> tuple[int, int]:
    """The processes a ledger entry's verdict was judged on, the baseline's and the candidate's, from its evidence
    (evidence(): each side's first file, then the other processes' files, NAME.pN.json beside them)."""
    base, cand = (Path(ev["path"]) for ev in evidence[:2])
    later = [Path(ev["path"]).name for ev in evidence[2:]]
    of = lambda first: 1 + sum(n.startswith(f"{first.stem}.p") and n.endswith(first.suffix) for n in later)
    return of(base), of(cand)


def process_paths(path: str, processes: int) -> list[str]:
    """The trace files of one side profiled in `processes` processes: `path`, then NAME.p2.json and on beside it."""
    p = Path(path)
    return [path, *(str(p.with_name(f"{p.stem}.p{i}{p.suffix}")) for i in range(2, processes + 1))]


def present(path: str, processes: int) -> int:
    """How many of a side's process files exist (side's count, without reading them)."""
    return sum(Path(p).is_file() for p in process_paths(path, processes))


def side(path: str, processes: int) -> list[Trace]:
    """A side's traces: `path` and the other processes' files beside it, those that exist (a baseline given as one
    file is one process)."""
    return [tracefile.load(p) for p in process_paths(path, processes) if Path(p).is_file()]


def pooled_median(traces: list[Trace]) -> float:
    """The median whole token over every process of a side."""
    return median(t for trace in traces for t in trace.token_wall_us)


def route_flags(context: int, tokens: int, beam: int, on: tuple[str, Route] | None) -> list[str]:
    """`boltbeam profile`'s flags for the whole token on the route `on` (path, route; None: tinygrad's own)."""
    return ["--context", str(context), "--tokens", str(tokens), "--beam", str(beam), "--route", on[0] if on else "none"]


def profile_route(model: str, device: str, path: str, sha: str, context: int, tokens: int, beam: int,
                  on: tuple[str, Route] | None, processes: int = 1,
                  ran: Callable[[], None] = lambda: None, workers: int = 1, last: int | None = None) -> tuple[str, Any]:
    """The whole token on the route `on` (path, route; None: tinygrad's own) profiled into `path`, and in
    `processes` - 1 more processes beside it (process_paths; up to `last` of them, the rest left to
    profile_and_judge), each fresh, `workers` at once (profile_side); `ran` is called after each: a baseline (path,
    trace of the first), as baseline_of reads it."""
    profile_side(model, device, path, processes, ran, "the baseline", *route_flags(context, tokens, beam, on),
                 workers=workers, last=last)
    return path, baseline_of(path, sha, device, context, beam, on[1] if on else None)


def first_batch(processes: int, workers: int, decisive: float) -> int:
    """How many of a side's processes run before its verdict may be settled (settled, at `decisive`): one batch of
    `workers`, or all of them where the rule is off (0)."""
    return min(workers, processes) if decisive > 0 else processes


def settled(bases: list[Trace], traces: list[Trace], checks: Checks, decisive: float) -> bool:
    """Whether the processes run so far settle the verdict: every pair gives one verdict and either it is
    inconclusive (no later pair could make the whole promote: judge_processes takes a disagreement as
    inconclusive) or each pair moved the median token by at least `decisive`, the same way (about three times the
    spread measured between one route's processes, so a later process is not expected to turn it; a baseline process
    that far off its route's would)."""
    pairs = [judge(b, c, checks) for b in bases for c in traces]
    verdicts = {j.verdict for j in pairs}
    return verdicts == {INCONCLUSIVE} or len(verdicts) == 1 and all(
        j.effect is not None and abs(j.effect.relative_change) >= decisive for j in pairs)


def profile_side(model: str, device: str, path: str, processes: int, ran: Callable[[], None], what: str,
                 *flags: str, workers: int = 1, first: int = 0, last: int | None = None) -> None:
    """`boltbeam profile` with `flags` into each of the side's files (process_paths; those from `first` to `last`),
    a fresh process each; with `workers` above 1, one process at a time on each of that many GPUs (gpus: the i-th
    file on GPU i mod workers). `ran` is called after each; a failure is refused in one line naming `what` was
    profiled, and no other process starts after it."""
    paths = process_paths(path, processes)[first:last]
    if first == 0:      # the side is made anew: files an earlier run left past these are not its processes
        for stale in process_paths(path, processes)[len(paths):]:
            Path(stale).unlink(missing_ok=True)
    if workers == 1:
        for each in paths:
            if failed := profile_elsewhere(model, device, each, *flags):
                raise Refused(f"profiling {what} failed: {failed}")
            ran()
        return
    placed = gpus(workers)
    waiting = {g: paths[g::workers] for g in range(workers)}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        def start(g: int) -> dict:
            return {pool.submit(profile_elsewhere, model, device, waiting[g].pop(0), *flags, gpu=placed[g]): g} \
                if waiting[g] else {}
        running = {f: g for g in range(workers) for f, g in start(g).items()}
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                g = running.pop(f)
                if failed := f.result():    # the others' running processes end; none starts
                    raise Refused(f"profiling {what} failed: {failed}")
                ran()
                running.update(start(g))


def gpus(workers: int) -> list[str]:
    """The GPUs `workers` processes run on at once, one each: the first of CUDA_VISIBLE_DEVICES where it is set (the
    GPUs this process may use), else the first `workers` of the machine; one line where it names too few, one twice,
    or one CUDA would not read (a negative index ends its list)."""
    visible = switches.VISIBLE_DEVICES.value if switches.VISIBLE_DEVICES.is_set else None
    named = [g.strip() for g in visible.split(",")] if visible is not None else [str(i) for i in range(workers)]
    ids = named[:workers]
    usable = {g for g in ids if g and not g.startswith("-")}
    if len(usable) < workers:
        raise BadInput(f"--workers {workers} needs a GPU each: CUDA_VISIBLE_DEVICES={visible!r} names {len(usable)} "
                       f"it can use")
    return ids


def space(family: Family, target: Target) -> tuple[list, Counter]:
    """BubbleBeam: every setting of the family whose rules hold in the target's facts, and the rest counted by
    the rule each breaks; values that make no setting (a fusion with every knob off is the route itself; the
    generated attention kernel takes no tensor-code knob) are not candidates."""
    legal, rejected = on_target(families()[family.name], target)
    return [family.of_values(s) for s in legal if family.admits(s)], rejected


def legal_space(family: Family, target: Target) -> tuple[list, Counter]:
    """The family's legal settings on the target and the rejected by reason, or one line on why none is legal."""
    legal, rejected = space(family, target)
    if not legal:
        raise BadInput(f"target {target.name}: no setting of {family.name} is legal there (" + "; ".join(
            f"{n} rejected: {why}" for why, n in rejected.most_common()) + ")")
    return legal, rejected


def check_on(family: Family, path: str, on: Route | None, target: Target) -> None:
    """A route the family's settings can go on (None: tinygrad's own): one the family can build on, on a
    target where a setting is legal. A route that sets the family already is searched again, where the
    family has another setting: each candidate replaces its setting, and the route as it is is the baseline."""
    if why := family.refuses(of_route(on, path) if on else {}):
        raise BadInput(why)
    legal, _ = legal_space(family, target)
    current = on.families.get(family.key) if on else None
    if current and all(_same_setting(s.stored(), current) for s in legal):
        raise BadInput(f"route {path} already sets {family.key} to the family's only setting here: nothing "
                       f"to search")


def _knobs_changed(stored, current) -> int:
    """How many knobs of a setting (as a route stores it) differ from the route's own setting of the family
    (a route without it: each knob that is on; a knob the route file predates reads as off)."""
    if not isinstance(stored, dict):
        return int(stored != current)
    current = current if isinstance(current, dict) else {}
    return sum(stored.get(k, 0) != current.get(k, 0) for k in stored.keys() | current.keys())


def _breaks(family: Family, settings_on: dict[str, Any], setting) -> str | None:
    """Why a route of these settings (by family key) cannot take the family at `setting`: another family on it
    builds on what the setting takes away (a layout not of the kernel form under gemv's geometries); None where
    nothing does."""
    broken = unmet({**settings_on, family.key: setting})
    return f"the route's {broken.name} builds on {broken.needs.what}" if broken else None


def _same_setting(stored, current) -> bool:
    """Whether a candidate (as a route stores it) is the route's own setting."""
    return current is not None and _knobs_changed(stored, current) == 0


def per_product(census, route_on: Route, legal: list, target: Target, cal: Calibration, most: int, seconds: float,
                say: Callable[[str], None], earlier: dict | None = None) -> tuple[Candidate | None, list]:
    """gemv: each product of the route's layout timed alone at its `most` best predicted geometries
    (search/alone.py; an earlier search's fastest first where `earlier` holds them), and the setting that
    gives each product its fastest, as a candidate whose prediction is those times, each as often as a
    token runs its product (None: no product timed)."""
    products = alone_timing.time_products(census, Setting(**route_on.families["layout"]), legal, target, cal, most, seconds, say,
                                          earlier)
    chosen = [p for p in products if p.best is not None]
    if not chosen:
        return None, products
    setting = gemv.PerProduct(tuple((p.key, Geometry.parse(p.best)) for p in chosen))
    return Candidate(setting, sum(p.count * p.bytes for p in chosen), 0, sum(p.count * p.best_us for p in chosen),
                     ("timed alone",)), products


def route_settings(on: Route | None) -> dict[str, Any] | None:
    """What a route sets of each whole-token family (None: tinygrad's own), as the ledger's scope keeps it."""
    return {f.key: on.families.get(f.key) for f in WHOLE_TOKEN.values()} | {ScopeKey.BEAM: on.beam} if on else None


def recalled(ledger, candidate_id: str, key: dict[str, Any]):
    """The newest verdict the ledger holds on this candidate in exactly this scope (the route it went on, the
    depth, the tokens, the engine...), or None."""
    from boltbeam.ledger.store import scope_matches
    return next((e for e in reversed(ledger.entries(candidate=candidate_id)) if scope_matches(e.scope, key)), None)


def recalled_per_product(ledger, scope: FamilyScope) -> Candidate | None:
    """gemv: the geometry for each product that the ledger judged in exactly this scope (as the products' times alone
    chose it then), so a second run on the ledger times no product alone again and reads that setting's verdict."""
    from boltbeam.ledger.store import scope_matches
    for e in reversed(ledger.entries()):
        name, _, flag = e.candidate.partition(" ")
        if (name == scope.family and "=" in flag and ScopeKey.PREDICTED_US in e.scope
                and scope_matches(e.scope, scope.of(flag))):
            return Candidate(gemv.PerProduct.parse(flag), 0, 0, e.scope[ScopeKey.PREDICTED_US], ("timed alone",))
    return None


def foreseen(family: Family, census, context: int, target: Target, on: tuple[str, Route] | None = None
             ) -> tuple[list[Candidate], Counter]:
    """FutureSight, on the CPU before any token runs: the family's legal settings the model can take as candidates
    on the route `on` (path, route; None: tinygrad's own), predicted best first, and the rejected by reason."""
    path_on, route_on = on if on else ("none", None)
    settings_on = of_route(route_on, path_on) if route_on else {}
    cal = calibration(target.name)
    legal, rejected = legal_space(family, target)
    candidates = []
    for s in legal:
        if why := family.unfit(census, s):      # the model's shape, not the chip, rules it out: counted as rejected
            rejected[f"the model: {why}"] += 1
            continue
        sight = family.foresee(census, s, context, target, cal, settings_on)
        candidates.append(Candidate(s, sight.bytes, sight.kernels, sight.us(target), sight.terms,
                                    sight.fraction))
    # Equal predictions: the fewest kernels first (a kernel costs a token something, so fewer is never predicted
    # slower; where the target has no measured cost of a kernel, the prediction prices kernels at nothing and
    # only this sees them), then the fewest knobs changed from the route's own setting (the least FutureSight
    # has not seen), then the legal space's order.
    current = route_on.families.get(family.key) if route_on else None
    candidates.sort(key=lambda c: (c.predicted_us, c.predicted_kernels, _knobs_changed(c.setting.stored(), current)))
    return candidates, rejected


def choose(family: Family, model: str, census, device: str, context: int, tokens: int, target: Target, ledger,
           sha: str, out: Path, say: Callable[[str], None] = lambda s: None, beam: int = 0, budget: int | None = None,
           baseline: tuple[str, Any] | None = None, on: tuple[str, Route] | None = None,
           alone: int | None = None, seconds: float = 30.0, earlier: dict | None = None, recall: bool = False,
           deadline: float | None = None, ran: Callable[[], None] = lambda: None,
           reference: Reference | None = None, processes: int = 1, workers: int = 1, decisive: float = 0.0,
           exclude: frozenset[str] = frozenset()) -> Choice:
    """Judge the family's `budget` best predicted settings (of those whose flag is not in `exclude`: judged
    already, on an earlier route) on the whole token, added to the route `on`
    (path, route, passed by check_on; replacing its own setting of the family, if any) or to tinygrad's own,
    against that route as it is (BEAM width `beam` on both
    sides; profiled here unless `baseline` is (path, trace) of it, from baseline_of); the fastest
    promoted one wins. gemv with `alone`: first each product's geometries are timed alone (per_product,
    at most `alone` a product and `seconds` of its own, an earlier search's fastest first where `earlier`,
    from alone.earlier_times, holds them), and the geometry for each product is judged first.
    With `recall`, a setting the ledger judged in exactly this scope keeps that verdict and is not timed
    again, and the baseline is profiled only when a setting runs. No setting starts after `deadline`
    (time.monotonic()); `ran` is called after each profile. With `reference`, a setting's output is held to the
    reference engine's tokens (the judge's reference gate), and the ledger's scope says so. Each side runs in
    `processes` processes (the baseline's other processes beside its file, process_paths) and the verdict is the
    one every pair of processes gives (judge_processes); `workers` of a side's processes run at once (profile_side),
    and with `decisive`, a first batch whose change is at least that settles the verdict (profile_and_judge)."""
    path_on, route_on = on if on else ("none", None)
    candidates, rejected = foreseen(family, census, context, target, on)
    current = route_on.families.get(family.key) if route_on else None
    scope = FamilyScope(TokenScope(sha, device, engine(), beam, context, tokens, route_settings(route_on), processes,
                                   decisive), target.name, family.name, label_of(route_on, beam), reference)
    products = []
    if alone and (deadline is None or time.monotonic() < deadline):
        first = recalled_per_product(ledger, scope) if recall else None
        if first is None:
            first, products = per_product(census, route_on, legal_space(family, target)[0], target,
                                          calibration(target.name), alone, seconds, say, earlier)
        candidates[:0] = [first] if first else []
    flags = route_flags(context, tokens, beam, on)

    def base() -> tuple[str, Any]:
        nonlocal baseline
        if baseline is None:
            say("the whole token without the family")
            baseline = profile_route(model, device, str(out / "baseline.json"), sha, context, tokens, beam, on,
                                     processes, ran, workers, first_batch(processes, workers, decisive))
        return baseline
    if not recall:
        base()
    base_us = pooled_median(side(baseline[0], processes)) if baseline else None
    tried, settings_on = 0, of_route(route_on, path_on) if route_on else {}
    for c in candidates:
        candidate_id = f"{family.name} {c.flag}"
        if current and not isinstance(c.setting, gemv.PerProduct) and _same_setting(c.setting.stored(), current):
            c.skipped = ROUTE_OWN
            continue
        if c.flag in exclude:
            c.skipped = EXCLUDED
            continue
        if why := _breaks(family, settings_on, c.setting):
            c.skipped = why
            continue
        beyond = f"{BEYOND_BUDGET}: FutureSight kept the {budget} best predicted setting(s)"
        if recall and budget is not None and tried >= budget:
            # Recalling, past the budget before the ledger is read: what it holds on this route beyond the budget
            # (a later round's verdict, in tune, where the route did not change between) is that round's.
            c.skipped = beyond
            continue
        key = scope.of(c.flag)
        if recall and (e := recalled(ledger, candidate_id, key)) is not None:
            c.verdict, c.reasons, c.median_us, c.ledger_id, c.recalled = (e.verdict, e.reasons,
                                                                          e.scope.get(ScopeKey.MEDIAN_US), e.id, True)
            c.before_us = e.scope.get(ScopeKey.BASELINE_MEDIAN_US)
            c.sides = sides_of(e.evidence) if len(e.evidence) >= 2 else None
            c.trace = next((ev["path"] for ev in e.evidence[1:]), None)
            base_us = base_us or e.scope.get(ScopeKey.BASELINE_MEDIAN_US)
            tried += 1
            continue
        skip, why = ledger.should_skip(candidate_id, key)
        if skip:
            c.skipped = why
            continue
        if budget is not None and tried >= budget:
            c.skipped = beyond
            continue
        if deadline is not None and time.monotonic() >= deadline:
            c.skipped = OUT_OF_TIME
            continue
        tried += 1
        baseline_path = base()[0]
        say(f"the whole token with {family.name} {c.flag}")
        path = out / f"{family.name}_{'per_product' if isinstance(c.setting, gemv.PerProduct) else c.flag.replace(':', '_')}.json"
        c.trace = str(path)
        expected = with_setting(family, route_on, c.setting, sha, device, target.name, beam)
        j, c.before_us, c.median_us, c.ledger_id, c.sides = profile_and_judge(
            model, device, ledger, candidate_id, {**key, ScopeKey.PREDICTED_US: c.predicted_us},
            Side(baseline_path, tuple(flags)), Side(str(path), (*flags, *family.flags(c.setting))), processes,
            workers, decisive, label_of(route_on, beam, labels(expected.families)), reference, "boltbeam search", ran,
            f"{family.name} {c.flag}")
        c.verdict, c.reasons, base_us = j.verdict, j.reasons, c.before_us
    promoted = [c for c in candidates if c.verdict == "promote"]
    chosen = min(promoted, key=lambda c: c.median_us) if promoted else None
    return Choice(family.name, base_us, candidates, chosen, dict(rejected), products)
