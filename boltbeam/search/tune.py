"""The decide loop across the whole-token families: from tinygrad's own route to the fastest one the
families reach, one family at a time (`boltbeam tune`).

Each family in turn has its best predicted setting judged on the whole token against the route so far
(search/choose.py: BubbleBeam's legal settings, FutureSight's best first, in fresh processes, the judge's verdict
in the ledger); a promoted setting joins the route, and its profile is the next family's baseline. That is the
first round; later rounds, while the budget (settings a family) and the time allow, give each family in the same
order its best predicted setting not yet judged, on the route the round before left, so a short tune has judged
every family's best before it spends time on any family's second.

The order: of the families the route so far can take (what a family builds on is there: gemv and fusion need
the layout's generated kernel), the one whose best legal setting is predicted to save the most against what the
route runs in its place goes first. Where the route runs a setting of the family, that is FutureSight's
prediction of the route's setting less the best's. Where it runs none, it is the time a profile of the route so
far spends in what the family declares it replaces (its Replaces, route/family.py: account's regions, such as
attention for split attention; kernel categories, such as the constants recomputed every token; the host's step
before a token's first kernel, for direct replay) less FutureSight's prediction of the best setting. That profile
is the baseline the family's settings are judged against, so it costs nothing more: the route of no family is
profiled before the first family is chosen, not inside its search, and each promoted
setting's profile is the next one's; where the ledger holds a verdict judged on the route so far, the profile it
was judged against is read instead, so a second tune on the same ledger profiles nothing and takes the same
order. A family priced neither way (no profile of the route was made in time; it records no host step) keeps
spaces.toml's order (the build order, route/families.py), after any predicted to save. A family the route or the
target can never take (no kernel-form layout was promoted; no setting legal there) is skipped with the reason.

"Output still correct" is the route so far's greedy tokens (so, step by step, tinygrad's default route's), or,
with a reference (llama.cpp's greedy tokens on the same prompt ids), the reference's. A verdict the ledger
holds in exactly the same scope (the route, the reference...) is read, not timed again, so a second tune on
the same ledger times nothing and writes the same route. No setting starts after the deadline.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from statistics import StatisticsError, median
from typing import Any, Callable

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.judge.judge import reference_gate
from boltbeam.judge.scope import ScopeKey
from boltbeam.measure import route as routes
from boltbeam.measure import trace as tracefile
from boltbeam.measure.route import Route, engine
from boltbeam.measure.trace import Trace
from boltbeam.route import gemv
from boltbeam.route.family import Family, Replaces
from boltbeam.route.families import built_on, of_route
from boltbeam.search.alone import Product
from boltbeam.foresight.future import PER_KERNEL_FACT, WRITERS, calibration
from boltbeam.search.choose import (BEYOND_BUDGET, EXCLUDED, OUT_OF_TIME, ROUTE_OWN, WHOLE_TOKEN, FamilyScope, Reference, Side,
                                    TokenScope, baseline_of, check_on, choose, first_batch, foreseen, label_of,
                                    legal_space, profile_and_judge, profile_route, recalled, route_flags,
                                    route_settings, present, sides_of, with_setting)

BEAM = 0     # the families are judged on tinygrad's heuristics; BEAM, where asked for, is the last step (beam_step)
BEAM_STEP = "beam"    # the step's name in tune.json and the ledger
HELD = "not changed in a later round under the families built on it"     # an unjudged setting's reason (the start)
# A BEAM step's search, in whole-token profiles of the route: on s22's H100 its first process took 102 s against
# 33-40 s for the profiles before it (bench/h200/s22/run/tune/phases.json); tune keeps that much time for it.
BEAM_SEARCH = 2
DEFAULT_ONLY = "checked against tinygrad's default route only"


def tunable(names: list[str] | None = None) -> list[Family]:
    """The families tune runs, in spaces.toml's order (the layout before the families that build on its generated
    kernel), which tune keeps where no saving is predicted; `names` keeps only those, one line on a name
    that is none of them."""
    every = list(WHOLE_TOKEN.values())
    if names is None:
        return every
    if unknown := [n for n in names if n not in WHOLE_TOKEN]:
        raise BadInput(f"--families: unknown {', '.join(unknown)} (known: {', '.join(WHOLE_TOKEN)})")
    return [f for f in every if f.name in names]


@dataclass
class Step:
    """One setting judged on the whole token against the route so far (or why it was not)."""
    family: str
    setting: str
    predicted_us: float | None      # None: FutureSight predicts nothing of it (BEAM's search)
    before_us: float | None         # the route so far: its median token
    after_us: float | None          # with the setting: its median token
    verdict: str | None             # None: not judged (skipped says why)
    reasons: list[str]
    ledger_id: int | None
    timed: bool                     # profiled in this run; else its verdict came from the ledger, or it was skipped
    skipped: str | None = None
    promoted: bool = False          # it joined the route
    sides: tuple[int, int] | None = None    # the processes its verdict was judged on: the baseline's, its own
    round: int = 1                  # tune's round: the first judges each family's best predicted setting, the second
                                    # its next best not yet judged, on the route the first left, and so on

    def to_dict(self) -> dict[str, Any]:
        tok_s = lambda us: 1e6 / us if us else None
        return {**asdict(self), "before_tok_s": tok_s(self.before_us), "after_tok_s": tok_s(self.after_us)}


@dataclass
class Beside:
    """Another engine's token at the tune's depth and tokens, profiled after the tune in a process of its own
    (`tune --compare`): its median plain token, or why it has none."""
    engine: str
    trace: str
    median_us: float | None = None
    why: str | None = None


@dataclass
class Unjudged:
    """A family's settings not judged for one reason shared by many (past the budget, out of time), counted."""
    family: str
    why: str
    settings: int


@dataclass
class Skip:
    family: str
    why: str


ROUTE_SETTING = "route_setting"   # against FutureSight's prediction of the route's own setting of the family
PROFILE = "profile"               # against the time the route's profile spends in what the family replaces


@dataclass
class Outlook:
    """A family on the route so far, as its turn came: FutureSight's best legal setting and its prediction, and
    what that is predicted to save against what the route runs in the family's place (`against`: ROUTE_SETTING or
    PROFILE, `against_us` its time; with PROFILE, `replaced_us` that time by region, category or "host")."""
    family: str
    best: str | None           # its best predicted setting (None: none the model can take)
    best_us: float | None
    gain_us: float | None      # against_us - best_us; None: not priced (why says why)
    against: str | None = None
    against_us: float | None = None
    replaced_us: dict[str, float] | None = None
    why: str | None = None


KEEPS = "it keeps spaces.toml's order"
NO_PROFILE = "no profile of the route so far to price what the family replaces (the time was spent before one ran)"


def time_in(trace: Trace, replaces: Replaces) -> dict[str, float] | None:
    """The per-token median time `trace` spends in each part of what a family replaces: each region's kernels, each
    category's outside those regions, and the host's step before a token's first kernel ("host"); None where that
    step is asked for and the trace records none."""
    from boltbeam.account.compare import region_of
    parts = (*replaces.regions, *replaces.categories)
    per_token = []
    for kernels in trace.by_token().values():
        d = dict.fromkeys(parts, 0.0)
        for k in kernels:
            if (r := region_of(k)) in replaces.regions:
                d[r] += k.duration_us
            elif k.category in replaces.categories:
                d[k.category] += k.duration_us
        per_token.append(d)
    times = {p: median(d[p] for d in per_token) if per_token else 0.0 for p in parts}
    if replaces.host:
        host = trace.kernel_pass.plain_host_us if trace.kernel_pass else None
        if not host:
            return None
        times["host"] = median(host)
    return times


def outlook(family: Family, census, context: int, target: Target, on: tuple[str, Route],
            profile: Trace | None) -> Outlook:
    """The family's best legal setting on the route `on` (path, route) and what it is predicted to save: against
    FutureSight's prediction of the route's own setting of the family where the route sets one, else against the
    time `profile` (of the route) spends in what the family replaces."""
    candidates, _ = foreseen(family, census, context, target, on)
    if not candidates:
        return Outlook(family.name, None, None, None, why=f"no legal setting the model can take: {KEEPS}")
    best = candidates[0]
    settings = of_route(on[1], on[0])
    if family.key in settings:
        from boltbeam.foresight.future import calibration
        now = family.foresee(census, settings[family.key], context, target, calibration(target.name), settings)
        return Outlook(family.name, best.flag, best.predicted_us, now.us(target) - best.predicted_us, ROUTE_SETTING,
                       now.us(target))
    parts = time_in(profile, family.replaces) if profile and family.replaces else None
    if parts is None:
        why = ("the family declares nothing it replaces" if family.replaces is None else NO_PROFILE if profile is None
               else "the route's profile records no host step before a token's first kernel")
        return Outlook(family.name, best.flag, best.predicted_us, None, why=f"{why}: {KEEPS}")
    against = sum(parts.values())
    return Outlook(family.name, best.flag, best.predicted_us, against - best.predicted_us, PROFILE, against, parts)


def first_of(ready: list[Family], gains: dict[str, float | None]) -> Family:
    """The family to run next of those the route can take (in spaces.toml's order): the one predicted to save the
    most, where one is predicted to save anything; else the first."""
    saving = [f for f in ready if (gains[f.name] or 0) > 0]
    return max(saving, key=lambda f: gains[f.name]) if saving else ready[0]


@dataclass
class Tune:
    """What tune did: every step, the families skipped and why, the route's token before and after."""
    model: str
    model_sha256: str
    device: str
    target: str
    context: int
    tokens: int
    minutes: float
    processes: int = 1                    # a side's processes for each verdict
    workers: int = 1                      # of those, how many ran at once, a GPU each
    decisive: float = 0.0                 # a first batch's change that settled a verdict on it (choose.settled)
    checked_against: str = DEFAULT_ONLY   # what "output still correct" held each setting to
    reference: Reference | None = None     # the reference engine's greedy tokens, where one was given
    start_output: str | None = None        # tinygrad's own route's tokens against the reference's (where profiled)
    order: list[Outlook] = field(default_factory=list)    # the families in the order they ran, each as it was chosen
    steps: list[Step] = field(default_factory=list)       # each setting judged, read, or skipped for its own reason
    unjudged: list[Unjudged] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    start_us: float | None = None    # tinygrad's own route (the first baseline)
    final_us: float | None = None    # the route written
    alone: list[Product] = field(default_factory=list)    # gemv's products timed alone in this run
    unmeasured: list[str] = field(default_factory=list)   # how products are written (future.WRITERS) whose fraction of
                                                          # the bandwidth FutureSight has not measured on the target
    kernel_cost_s: float | None = None   # the target's measured cost of one more kernel (PER_KERNEL_FACT); None:
                                         # unmeasured, so FutureSight prices kernels only in its ties (choose.foreseen)
    profiles: int = 0                # whole tokens profiled in this run
    out_of_time: bool = False
    seconds: float = 0.0
    final_trace: str | None = None   # the profile of the route written (None: none was made in time)
    final_account: Any = None        # account.tieout's Account of that profile on the target (None: none made, or
    no_account: str | None = None    # refused before its lines: no_account says why)
    beside: Beside | None = None     # --compare's engine, at the same depth

    @property
    def promoted(self) -> list[Step]:
        return [s for s in self.steps if s.promoted]

    def not_judged(self) -> list[Unjudged]:
        """Every setting not judged, counted by family and reason: the counted ones and the steps skipped."""
        skipped = Counter((s.family, s.skipped) for s in self.steps if s.skipped)
        return [*self.unjudged, *(Unjudged(family, why, n) for (family, why), n in skipped.items())]

    def to_dict(self) -> dict[str, Any]:
        tok_s = lambda us: 1e6 / us if us else None
        return {**{k: v for k, v in asdict(self).items() if k not in ("steps", "final_account")},
                "steps": [s.to_dict() for s in self.steps],
                "final_account": self.final_account.to_dict() if self.final_account else None,
                "start_tok_s": tok_s(self.start_us), "final_tok_s": tok_s(self.final_us)}


def planned(family: Family, target: Target, budget: int | None) -> int:
    """Profiles a family is expected to take at most: its legal settings within the budget, and a baseline."""
    try:
        n = len(legal_space(family, target)[0])
    except BadInput:
        return 0
    return min(n, budget or n) + 1


def reference_of(model: str, census, device: str, context: int, tokens: int,
                 progress: Callable[[str, int], None] | None = None) -> Reference:
    """llama.cpp's greedy tokens on the prompt ids every profile of the tune decodes, over every step a profile of
    `tokens` a side decodes (its own process, nothing timed)."""
    from boltbeam.measure.llama_cpp_run import reference_tokens
    from boltbeam.measure.tinygrad_run import WARMUP, decoded, default_timing, prompt_tokens
    output, engine_name = reference_tokens(model, prompt_tokens(context, census.facts.vocabulary),
                                           decoded(tokens, WARMUP, default_timing(device)), progress)
    return Reference(engine_name, output)


def tune(model: str, census, device: str, target: Target, context: int, tokens: int, ledger, sha: str, out: Path,
         families: list[Family], budget: int | None, minutes: float, say: Callable[[str], None] = lambda s: None,
         ran: Callable[[], None] = lambda: None, left: Callable[[int], None] = lambda n: None,
         reference: Reference | None = None, alone: int | None = None, seconds: float = 20.0,
         beam: int = 0, processes: int = 1, workers: int = 1, decisive: float = 0.0) -> tuple[Tune, Route]:
    """Each family's best predicted setting judged against the route so far, in the order of the savings predicted
    (the module's docstring), then in later rounds each one's next best, at most `budget` a family (None: until
    the time or the settings are spent), within `minutes`; the route every promoted setting composed (of no family
    where none was). Traces and each step's
    route go under `out/traces`; `left` hears the profiles still planned after each family. With `reference`,
    each setting's output is held to its tokens. With `alone`, gemv first times each product alone at its `alone`
    best predicted geometries (`seconds` a product) and judges the fastest geometry for each product first (where
    the ledger judged that already, its setting is read and nothing is timed). With `beam`, the last step: the route
    so far with tinygrad's BEAM at that width for the kernels its families leave to tinygrad (beam_step). Each side
    of each verdict runs in `processes` processes, `workers` at once, all but a first batch only where its change is
    under `decisive` (choose)."""
    started = time.monotonic()
    deadline = started + minutes * 60
    if first_batch(processes, workers, decisive) == processes:
        decisive = 0.0      # every process runs in the first batch: nothing is left to settle, nor to scope by it
    record = Tune(model, sha, device, target.name, context, tokens, minutes, processes, workers, decisive,
                  reference=reference,
                  checked_against=f"checked against {reference.engine}'s greedy tokens on the same prompt ids"
                  if reference else DEFAULT_ONLY)
    record.unmeasured = [w for w in WRITERS if w not in calibration(target.name).bandwidth_fraction]
    record.kernel_cost_s = target.fact(PER_KERNEL_FACT)
    # The start: a route of no family, run as every later route is (its token is tinygrad's own), so each
    # promoted setting's profile is the next family's baseline as it stands.
    start = Route(sha, engine(), device, target.name, "tune", "generated by search", [])
    routes.save(start, out / "traces" / "route.json")
    on, baseline = (str(out / "traces" / "route.json"), start), None

    def counted() -> None:
        record.profiles += 1
        ran()
    unjudged: dict[str, Counter] = {}      # each family's settings its latest turn left unjudged, by reason
    turns = 0

    def turn(family: Family, deadline_now: float, round_no: int) -> int:
        """The family's best predicted setting not yet judged in this tune, judged on the route so far; its steps
        recorded, and the route and baseline it leaves. Returns the settings it judged (timed or read)."""
        nonlocal on, baseline, turns
        turns += 1
        folder = out / "traces" / f"{turns}_{family.name}"
        folder.mkdir(parents=True, exist_ok=True)
        earlier = frozenset(s.setting for s in record.steps if s.family == family.name)
        choice = choose(family, model, census, device, context, tokens, target, ledger, sha, folder, say, beam=BEAM,
                        budget=1, baseline=baseline, on=on, recall=True, deadline=deadline_now, ran=counted,
                        reference=reference, alone=alone if family.name == gemv.FAMILY.name else None,
                        seconds=seconds, processes=processes, workers=workers, decisive=decisive, exclude=earlier)
        record.start_us = record.start_us or choice.baseline_median_us
        record.alone += choice.alone
        unjudged[family.name] = Counter()
        steps = 0
        for c in choice.candidates:
            record.out_of_time |= c.skipped == OUT_OF_TIME
            if c.skipped in (ROUTE_OWN, EXCLUDED):
                continue
            if c.skipped and (c.skipped == OUT_OF_TIME or c.skipped.startswith(BEYOND_BUDGET)):
                unjudged[family.name][c.skipped] += 1      # counted, not listed: gemv alone has thousands of legal geometries
                continue
            record.steps.append(Step(family.name, c.flag, c.predicted_us, c.before_us or choice.baseline_median_us,
                                     c.median_us, c.verdict, c.reasons, c.ledger_id, bool(c.verdict) and not c.recalled,
                                     c.skipped, c is choice.chosen, c.sides, round_no))
            steps += bool(c.verdict)
        if choice.chosen is None:     # the route stays: so does its profile, where this family made one
            baseline = baseline or _earlier(str(folder / "baseline.json"), sha, device, context, on[1], out, processes)
            return steps
        route = with_setting(family, on[1], choice.chosen.setting, sha, device, target.name, BEAM)
        routes.save(route, folder / "route.json")     # the route the next family's settings go on
        on = str(folder / "route.json"), route
        baseline = _earlier(choice.chosen.trace, sha, device, context, route, out, processes)
        return steps

    waiting = list(families)
    while waiting:      # the first round: each family's best predicted setting, in the order of predicted savings
        left(processes * sum(planned(f, target, budget) for f in waiting))
        ready, why_not = [], {}
        for f in waiting:
            try:
                check_on(f, *on, target)
                ready.append(f)
            except BadInput as e:
                why_not[f.name] = str(e)
        if not ready:       # what the rest build on never joined the route, or no setting of theirs is legal here
            for f in waiting:
                record.skipped.append(Skip(f.name, why_not[f.name]))
                say(f"skipped {f.name}: {why_not[f.name]}")
            break
        if baseline is None and any(f.key not in of_route(on[1], on[0]) for f in ready):
            # the route's profile prices the families it does not set, and is the next family's baseline
            baseline = ledger_profile(ledger, on, sha, device, context, tokens, processes, decisive, out)
            if baseline is None and time.monotonic() < deadline:
                say("the whole token on the route so far")
                baseline = profile_route(model, device, str(Path(on[0]).with_suffix(".trace.json")), sha, context,
                                         tokens, BEAM, on, processes, counted, workers,
                                         first_batch(processes, workers, decisive))
        if reference and on[1] is start and record.start_output is None and baseline:
            # tinygrad's own route off the reference: no setting that keeps its tokens can be promoted
            record.start_output = reference_gate(baseline[1], reference.engine, reference.output_tokens,
                                                 0.0).sentence
        outlooks = {f.name: outlook(f, census, context, target, on, baseline and baseline[1]) for f in ready}
        family = first_of(ready, {name: o.gain_us for name, o in outlooks.items()})
        waiting.remove(family)
        record.order.append(outlooks[family.name])
        turn(family, deadline, 1)
    # Later rounds, while the budget (settings a family) and the time allow: each family of the first round again, in
    # its order, its best predicted setting not yet judged, on the route so far; a family whose last turn left nothing
    # unjudged is done. gemv's later turns are left out where its first judged a geometry for each product from their
    # times alone (with `alone`): one geometry shared by every product is what those times already ranked. A family
    # that another on the route builds on is not changed under it (the layout under gemv's geometries, which were
    # timed on its products). With BEAM asked for, no later round's setting starts where the time left would not
    # hold BEAM's step (beam_reserve).
    round_no, out_of_rounds, held = 2, False, {}
    while budget is None or round_no <= budget:
        reserve = beam_reserve(baseline, processes, time.monotonic() - started, record.profiles) if beam else 0.0
        judged = 0
        for o in record.order:
            family = WHOLE_TOKEN[o.family]
            if not sum(unjudged.get(family.name, Counter()).values()) or (family.name == gemv.FAMILY.name and alone):
                continue
            try:
                check_on(family, *on, target)
            except BadInput:
                continue
            if above := built_on(family, of_route(on[1], on[0])):
                held[family.name] = above.name
                continue
            if time.monotonic() >= deadline - reserve:
                out_of_rounds = True
                break
            judged += turn(family, deadline - reserve, round_no)
        if out_of_rounds or not judged:
            break
        round_no += 1
    # What each family's last turn left: held where another on the route builds on it, out of time where the rounds
    # stopped for it before the family's budget was spent, else past the budget (the settings it judged, FutureSight's
    # best).
    record.out_of_time |= out_of_rounds
    for name, left_by in unjudged.items():
        judged_here = sum(1 for s in record.steps if s.family == name and s.verdict)
        spent = (budget is not None and judged_here >= budget) or (name == gemv.FAMILY.name and alone)
        for why, n in left_by.items():
            if why.startswith(BEYOND_BUDGET):
                why = (f"{HELD}: {held[name]} builds on it" if name in held and not spent else
                       OUT_OF_TIME if out_of_rounds and not spent else
                       f"{BEYOND_BUDGET}: FutureSight kept the {judged_here} best predicted setting(s)")
            record.unjudged.append(Unjudged(name, why, n))
    if beam:
        folder = out / "traces" / f"{turns + 1}_{BEAM_STEP}"
        step, beamed, baseline = beam_step(model, device, target, context, tokens, ledger, sha, folder, on, baseline,
                                           beam, deadline, say, counted, reference, processes, workers, decisive)
        step.round = max((s.round for s in record.steps), default=1)     # on the route the last round left
        record.steps.append(step)
        record.start_us = record.start_us or step.before_us
        record.out_of_time |= step.skipped == OUT_OF_TIME
        if beamed is not None:
            folder.mkdir(parents=True, exist_ok=True)
            routes.save(beamed, folder / "route.json")
            on = str(folder / "route.json"), beamed
    record.final_us = record.promoted[-1].after_us if record.promoted else record.start_us
    if baseline is not None:      # the route written, as profiled: its account on the target
        record.final_trace = baseline[0]
        try:
            record.final_account = final_account(baseline[1], census, target, context)
        except (BadInput, Refused) as e:
            record.no_account = str(e)
    else:
        record.no_account = ("no profile of the route was made in the time" if record.out_of_time else
                             "no profile of the route written is here to read (gone, or of another run)")
    record.seconds = round(time.monotonic() - started, 1)
    return record, on[1]


def beside(engine_name: str, model: str, device: str, context: int, tokens: int, out: Path) -> Beside:
    """The engine's token at the tune's depth and tokens, in a process of its own (`boltbeam profile --engine`):
    its median plain token, or the line it refused with."""
    from boltbeam.measure.tinygrad_run import profile_elsewhere
    path = out / "traces" / f"{engine_name.replace('.', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    why = profile_elsewhere(model, device, str(path), "--engine", engine_name, "--context", str(context),
                            "--tokens", str(tokens))
    if why is None:
        try:
            return Beside(engine_name, str(path), median(tracefile.load(str(path)).token_wall_us))
        except (BadInput, StatisticsError) as e:       # said, not raised: the tune's own files are still written
            why = str(e) or "no plain token in its trace"
    return Beside(engine_name, str(path), why=why)


def final_account(trace: Trace, census, target: Target, context: int):
    """The account of the written route's profile on the target (account.tieout), as `boltbeam account` makes it."""
    from boltbeam.account.tieout import account
    from boltbeam.bound.roofline import bound
    return account(trace, bound(census, target, context=context, batch=1), target)


def beam_reserve(baseline, processes: int, elapsed_s: float, profiles: int) -> float:
    """The seconds BEAM's step is expected to take on the route so far: a side's processes and the search's
    BEAM_SEARCH more, each as long as the route's own profile took (its phases; where it recorded none, the mean
    seconds a profile has taken in the tune so far, everything between them included)."""
    phases = baseline[1].provenance.phases if baseline and baseline[1] is not None else None
    each = sum(astuple(phases)) if phases else elapsed_s / max(1, profiles)
    return each * (processes + BEAM_SEARCH)


def beam_step(model: str, device: str, target: Target, context: int, tokens: int, ledger, sha: str, folder: Path,
              on: tuple[str, Route], baseline, width: int, deadline: float, say: Callable[[str], None],
              ran: Callable[[], None], reference: Reference | None, processes: int = 1, workers: int = 1,
              decisive: float = 0.0) -> tuple[Step, Route | None, Any]:
    """The route so far with tinygrad's BEAM at `width` for every kernel its families leave to tinygrad (the
    norms' reductions, the residual adds, the rest), judged on the whole token against the route as it is, in
    `processes` processes a side, `workers` at once, as every family (the later ones take BEAM's choices from tinygrad's
    cache; all but a first batch only where its change is under `decisive`).
    Promoted, the route carries the kernels as that run compiled them (judged_by), so a load rebuilds them without
    searching. A verdict the ledger holds in this scope is read, not timed again. Returns the step, the route it
    leaves (None: unchanged) and that route's profile (BEAM's run where promoted, None where that is gone; else the
    baseline, profiled here where none was)."""
    route_on = on[1]
    scope = FamilyScope(TokenScope(sha, device, engine(), BEAM, context, tokens, route_settings(route_on), processes,
                                   decisive), target.name, BEAM_STEP, label_of(route_on, BEAM), reference)
    setting = f"width={width}"      # not a bare number: the ledger's should_skip matches settings across families
    candidate_id = f"{BEAM_STEP} {setting}"
    key = scope.of(setting)
    trace = None
    if (e := recalled(ledger, candidate_id, key)) is not None:
        step = Step(BEAM_STEP, setting, None, e.scope.get(ScopeKey.BASELINE_MEDIAN_US), e.scope.get(ScopeKey.MEDIAN_US),
                    e.verdict, e.reasons, e.id, False, sides=sides_of(e.evidence) if len(e.evidence) >= 2 else None)
        trace = next((ev["path"] for ev in e.evidence[1:]), None)
    elif (skip := ledger.should_skip(candidate_id, key))[0]:
        return Step(BEAM_STEP, setting, None, None, None, None, [], None, False, skip[1]), None, baseline
    elif time.monotonic() >= deadline:
        return Step(BEAM_STEP, setting, None, None, None, None, [], None, False, OUT_OF_TIME), None, baseline
    else:
        folder.mkdir(parents=True, exist_ok=True)
        if baseline is None:
            say("the whole token on the route so far")
            baseline = profile_route(model, device, str(folder / "baseline.json"), sha, context, tokens, BEAM, on,
                                     processes, ran, workers, first_batch(processes, workers, decisive))
        candidate = dataclasses.replace(route_on, beam=width)
        routes.save(candidate, folder / "candidate.json")
        say(f"the whole token with BEAM {width} (tinygrad searches the kernels the families leave to it)")
        trace = str(folder / f"beam_{width}.json")
        flags = route_flags(context, tokens, width, (str(folder / "candidate.json"), candidate))
        j, before, after, ledger_id, sides = profile_and_judge(
            model, device, ledger, candidate_id, key, Side(baseline[0], tuple(route_flags(context, tokens, BEAM, on))),
            Side(trace, tuple(flags)), processes, workers, decisive, label_of(route_on, width), reference,
            "boltbeam tune", ran, f"BEAM {width}")
        step = Step(BEAM_STEP, setting, None, before, after, j.verdict, j.reasons, ledger_id, True, sides=sides)
    if step.verdict != "promote":
        return step, None, baseline
    step.promoted = True
    profiled = None      # the BEAM run's profile, where it is still here and ran this route
    if trace and Path(trace).is_file():
        try:
            profiled = (trace, baseline_of(trace, sha, device, context, width, route_on))
        except BadInput:
            pass
    return step, routes.judged_by(dataclasses.replace(route_on, beam=width), trace), profiled


def ledger_profile(ledger, on: tuple[str, Route], sha: str, device: str, context: int, tokens: int,
                   processes: int = 1, decisive: float = 0.0, out: Path | None = None):
    """The profile of the route `on` (path, route) that the newest verdict the ledger holds on it (this model,
    device, engine, depth and tokens) was judged against, as a baseline, where the file stands as the ledger hashed
    it (else None)."""
    from boltbeam.files import sha256_file
    from boltbeam.ledger.store import scope_matches
    key = TokenScope(sha, device, engine(), BEAM, context, tokens, route_settings(on[1]), processes,
                     decisive).as_json()
    for e in reversed(ledger.entries()):
        if not e.evidence or not scope_matches(e.scope, key):
            continue
        first = e.evidence[0]       # the baseline's first process; every file must stand as the ledger hashed it
        if all(Path(ev["path"]).is_file() and sha256_file(ev["path"]) == ev["sha256"] for ev in e.evidence) and \
                (found := _earlier(first["path"], sha, device, context, on[1], out, processes)):
            return found
    return None


def _earlier(path: str | None, sha: str, device: str, context: int, route: Route, out: Path | None = None,
             processes: int = 1):
    """A profile of `route` (the promoted setting's, or the route's own) as the next family's baseline, where it
    stands and ran that route (else None: the next family profiles the route itself if a setting runs). One outside
    `out` (an earlier tune's, read from the ledger) serves only with all its processes: a verdict settled on fewer
    would have the rest profiled beside it, outside this tune's folder."""
    if not path or not Path(path).is_file():
        return None
    if out is not None and not Path(path).resolve().is_relative_to(Path(out).resolve()) and \
            present(path, processes) < processes:
        return None
    try:
        return path, baseline_of(path, sha, device, context, BEAM, route)
    except BadInput:
        return None
