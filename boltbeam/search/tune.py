"""The decide loop across the whole-token families: from tinygrad's own route to the fastest one the
families reach, one family at a time (`boltbeam tune`).

Each family in turn has its settings judged on the whole token against the route so far (search/choose.py:
BubbleBeam's legal settings, FutureSight's best first, each in a fresh process, the judge's verdict in the
ledger); the fastest promoted setting joins the route, and its profile is the next family's baseline.

The order: of the families the route so far can take (what a family builds on is there: gemv and fusion need
the layout's generated kernel), the one whose best legal setting FutureSight predicts saves the most against
what the route runs in its place goes first. FutureSight prices a family's own settings, so it predicts a
saving only where the route already runs one of them; where the route runs tinygrad's own kernels in the
family's place, their time is known only once the route is profiled, and no saving is predicted: those
families keep spaces.toml's order (the build order, route/families.py), after any predicted to save. The order
is FutureSight's alone (the CPU's, before any token runs), so a second tune takes the same one. A family the
route or the target can never take (no kernel-form layout was promoted; no setting legal there) is skipped
with the reason.

"Output still correct" is the route so far's greedy tokens (so, step by step, tinygrad's default route's), or,
with a reference (llama.cpp's greedy tokens on the same prompt ids), the reference's. A verdict the ledger
holds in exactly the same scope (the route, the reference...) is read, not timed again, so a second tune on
the same ledger times nothing and writes the same route. No setting starts after the deadline.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput
from boltbeam.judge.judge import reference_gate
from boltbeam.measure import route as routes
from boltbeam.measure import trace as tracefile
from boltbeam.measure.route import Route, engine
from boltbeam.route.family import Family
from boltbeam.route.families import of_route
from boltbeam.search.choose import (WHOLE_TOKEN, Reference, baseline_of, check_on, choose, foreseen, legal_space,
                                    with_setting)

BEAM = 0     # the route's kernels keep tinygrad's heuristics: BEAM is not searched by tune
DEFAULT_ONLY = "checked against tinygrad's default route only"


def tunable(names: list[str] | None = None) -> list[Family]:
    """The families tune runs, in spaces.toml's order (the layout before the families that build on its generated
    kernel), which tune keeps where FutureSight predicts no saving; `names` keeps only those, one line on a name
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
    predicted_us: float
    before_us: float | None         # the route so far: its median token
    after_us: float | None          # with the setting: its median token
    verdict: str | None             # None: not judged (skipped says why)
    reasons: list[str]
    ledger_id: int | None
    timed: bool                     # profiled in this run; else its verdict came from the ledger, or it was skipped
    skipped: str | None = None
    promoted: bool = False          # it joined the route

    def to_dict(self) -> dict[str, Any]:
        tok_s = lambda us: 1e6 / us if us else None
        return {**asdict(self), "before_tok_s": tok_s(self.before_us), "after_tok_s": tok_s(self.after_us)}


@dataclass
class Skip:
    family: str
    why: str


@dataclass
class Outlook:
    """FutureSight's view of a family on the route so far, as its turn came: its best legal setting's prediction,
    and what that saves against the route's own setting of the family, where the route runs one."""
    family: str
    best: str | None           # its best predicted setting (None: none the model can take)
    best_us: float | None
    gain_us: float | None      # None: not predicted (why says why)
    why: str | None = None


NOT_PREDICTED = ("FutureSight prices the family's settings, not the tinygrad kernels the route so far runs in their "
                 "place: their time waits on the route's profile, so it keeps spaces.toml's order")


def gain(family: Family, census, context: int, target: Target, on: tuple[str, Route]) -> float | None:
    """FutureSight's predicted saving of the family's best setting on the route `on` (path, route): its prediction
    of the route's own setting of the family less the best's; None where the route sets none."""
    settings = of_route(on[1], on[0])
    if family.key not in settings:
        return None
    from boltbeam.search.future import calibration
    candidates, _ = foreseen(family, census, context, target, on)
    now = family.foresee(census, settings[family.key], context, target, calibration(target.name), settings)
    return now.us(target) - candidates[0].predicted_us if candidates else None


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
    checked_against: str = DEFAULT_ONLY   # what "output still correct" held each setting to
    reference: Reference | None = None     # the reference engine's greedy tokens, where one was given
    start_output: str | None = None        # tinygrad's own route's tokens against the reference's (where profiled now)
    order: list[Outlook] = field(default_factory=list)    # the families in the order they ran, each as it was chosen
    steps: list[Step] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    start_us: float | None = None    # tinygrad's own route (the first baseline)
    final_us: float | None = None    # the route written
    profiles: int = 0                # whole tokens profiled in this run
    out_of_time: bool = False
    seconds: float = 0.0

    @property
    def promoted(self) -> list[Step]:
        return [s for s in self.steps if s.promoted]

    def to_dict(self) -> dict[str, Any]:
        tok_s = lambda us: 1e6 / us if us else None
        return {**{k: v for k, v in asdict(self).items() if k != "steps"}, "steps": [s.to_dict() for s in self.steps],
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
         reference: Reference | None = None) -> tuple[Tune, Route]:
    """Each family judged against the route so far, in FutureSight's order (the module's docstring), within
    `minutes`; the route every promoted setting composed (of no family where none was). Traces and each step's
    route go under `out/traces`; `left` hears the profiles still planned after each family. With `reference`,
    each setting's output is held to its tokens."""
    started = time.monotonic()
    deadline = started + minutes * 60
    record = Tune(model, sha, device, target.name, context, tokens, minutes, reference=reference,
                  checked_against=f"checked against {reference.engine}'s greedy tokens on the same prompt ids"
                  if reference else DEFAULT_ONLY)
    # The start: a route of no family, run as every later route is (its token is tinygrad's own), so each
    # promoted setting's profile is the next family's baseline as it stands.
    start = Route(sha, engine(), device, target.name, "tune", "generated by search", [])
    routes.save(start, out / "traces" / "route.json")
    on, baseline = (str(out / "traces" / "route.json"), start), None

    def counted() -> None:
        record.profiles += 1
        ran()
    waiting = list(families)
    while waiting:
        left(sum(planned(f, target, budget) for f in waiting))
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
        gains = {f.name: gain(f, census, context, target, on) for f in ready}
        family = first_of(ready, gains)
        waiting.remove(family)
        folder = out / "traces" / f"{len(record.order) + 1}_{family.name}"
        folder.mkdir(parents=True, exist_ok=True)
        choice = choose(family, model, census, device, context, tokens, target, ledger, sha, folder, say, beam=BEAM,
                        budget=budget, baseline=baseline, on=on, recall=True, deadline=deadline, ran=counted,
                        reference=reference)
        best = choice.candidates[0] if choice.candidates else None    # FutureSight's best first
        record.order.append(Outlook(family.name, best and best.flag, best and best.predicted_us, gains[family.name],
                                    None if gains[family.name] is not None else NOT_PREDICTED))
        record.start_us = record.start_us or choice.baseline_median_us
        if reference and on[1] is start and record.start_output is None and (folder / "baseline.json").is_file():
            # tinygrad's own route off the reference: no setting that keeps its tokens can be promoted
            record.start_output = reference_gate(tracefile.load(str(folder / "baseline.json")), reference.engine,
                                                 reference.output_tokens, 0.0).sentence
        for c in choice.candidates:
            record.out_of_time |= bool(c.skipped and c.skipped.startswith("out of time"))
            record.steps.append(Step(family.name, c.flag, c.predicted_us, choice.baseline_median_us, c.median_us,
                                     c.verdict, c.reasons, c.ledger_id, bool(c.verdict) and not c.recalled,
                                     c.skipped, c is choice.chosen))
        if choice.chosen is None:     # the route stays: so does its profile, where this family made one
            baseline = baseline or _earlier(str(folder / "baseline.json"), sha, device, context, on[1])
            continue
        route = with_setting(family, on[1], choice.chosen.setting, sha, device, target.name, BEAM)
        routes.save(route, folder / "route.json")     # the route the next family's settings go on
        on = str(folder / "route.json"), route
        baseline = _earlier(choice.chosen.trace, sha, device, context, route)
    record.final_us = record.promoted[-1].after_us if record.promoted else record.start_us
    record.seconds = round(time.monotonic() - started, 1)
    return record, on[1]


def _earlier(path: str | None, sha: str, device: str, context: int, route: Route):
    """A profile of `route` (the promoted setting's, or the route's own) as the next family's baseline, where it
    stands and ran that route (else None: the next family profiles the route itself if a setting runs)."""
    if not path or not Path(path).is_file():
        return None
    try:
        return path, baseline_of(path, sha, device, context, BEAM, route)
    except BadInput:
        return None
