"""BubbleBeam: the legal settings of each kernel, listed from the chip's declared facts alone (CPU only).

A family in data/spaces.toml lists its parameters' values and its rules in chip facts. For one
kernel, BubbleBeam takes every combination of values and keeps those that (1) fit the kernel's shape
(each split divides the axis it splits) and (2) satisfy every rule on the target. Each rejected
setting is counted under the one reason that rejected it first: the fact it breaks, or the kernel
axis it does not divide. Nothing here runs on a device or asks the compiler.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput

SEARCHED_BY = "tinygrad-opts"          # the code path the search drives today
OPS = ("<=", "multiple_of", "divides")
# Where each parameter of a tinygrad-opts family splits the kernel: the output axis or the reduction.
SPLITS = {"local": "output", "upcast": "output", "group": "reduce", "unroll": "reduce"}
# Parameters that choose which reduction axis a split takes: 0 the longest, 1 the next, ...
WHICH = {"group_axis": "group", "unroll_axis": "unroll"}


@dataclass(frozen=True)
class Rule:
    product: tuple[str, ...]
    op: str
    fact: str
    why: str
    needs: tuple[str, ...]      # the parameters that need the fact: held at 1 on a target without it (none: every setting)
    when: str | None = None     # a switch (0 or 1) the rule holds under: settings with it off need nothing


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    expressed_by: str
    parameters: dict[str, tuple[int, ...]]
    rules: tuple[Rule, ...]
    constants: dict[str, int]



@dataclass(frozen=True)
class KernelShape:
    """What BubbleBeam needs of one kernel: its axes as the compiler sees them (no device)."""
    key: str
    name: str
    output: int | None      # length of the output axis the settings split: the longest (None: no such axis)
    reduce: int | None      # length of the reduction axis they split: the longest (None: not a reduction)
    outputs: int = 1        # output elements over every output axis
    # Where those axes sit in the compiler's own numbering (see search.compiler.opts_of).
    output_axis: int | None = None
    reduces: tuple[int, ...] = ()    # every reduction axis's length, in the compiler's order (0: symbolic)

    def reduce_ranks(self) -> list[int]:
        """The places, in the compiler's order, of the reduction axes a split may take (longer than 1:
        a symbolic one, such as the KV position, is never split), longest first (ties: compiler order)."""
        lengths = self.reduce_lengths()
        return sorted((i for i in range(len(lengths)) if lengths[i] > 1), key=lambda i: (-lengths[i], i))

    def reduce_lengths(self) -> tuple[int, ...]:
        return self.reduces or ((self.reduce,) if self.reduce else ())


@dataclass
class Space:
    kernel: KernelShape
    legal: list[dict[str, int]]
    rejected: Counter = field(default_factory=Counter)   # reason -> settings

    @property
    def size(self) -> int:
        return len(self.legal) + sum(self.rejected.values())


def families(text: str | None = None) -> dict[str, Family]:
    """The families of data/spaces.toml (or of `text`), checked: a malformed family is bad input."""
    if text is None:
        return dict(_packaged())
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"spaces.toml: not valid TOML ({e})") from None
    return {name: _family(name, body) for name, body in data.items()}


@functools.cache
def _packaged() -> dict[str, Family]:
    """data/spaces.toml's families, read once a process: every setting made (a search makes thousands) checks
    its knobs against them."""
    return families(resources.files("boltbeam.data").joinpath("spaces.toml").read_text())


def _family(name: str, body: Any) -> Family:
    where = f"spaces.toml: family {name!r}"
    if not isinstance(body, dict) or not isinstance(body.get("parameters"), dict):
        raise BadInput(f"{where}: needs a parameters table")
    params = {}
    for p, values in body["parameters"].items():
        if not isinstance(values, list) or not values or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise BadInput(f"{where}: parameter {p!r} needs a list of non-negative integers")
        params[p] = tuple(values)
    constants = body.get("constants", {})
    if not isinstance(constants, dict) or not all(isinstance(v, int) and v >= 1 for v in constants.values()):
        raise BadInput(f"{where}: constants must be positive integers")
    rules = []
    for r in body.get("rules", []):
        if not isinstance(r, dict) or r.get("op") not in OPS or not isinstance(r.get("fact"), str):
            raise BadInput(f"{where}: a rule needs op ({', '.join(OPS)}) and fact")
        names = r.get("product", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadInput(f"{where}: a rule's product must be a list of names")
        unknown = [n for n in [*r.get("needs", []), *([r["when"]] if "when" in r else [])] if n not in params]
        if unknown:
            raise BadInput(f"{where}: a rule needs {', '.join(map(str, unknown))}, which is not a parameter")
        rules.append(Rule(tuple(names), r["op"], r["fact"], str(r.get("why", "")), tuple(r.get("needs", names)),
                          r.get("when")))
    return Family(name, str(body.get("description", "")), str(body.get("expressed_by", "")), params,
                  tuple(rules), dict(constants))


def searchable(name: str, known: dict[str, Family] | None = None) -> Family:
    """The family the search can drive, or one clear line on why not."""
    known = known if known is not None else families()
    if name not in known:
        raise BadInput(f"unknown family {name!r} in spaces.toml; known: {', '.join(sorted(known))}")
    fam = known[name]
    if fam.expressed_by != SEARCHED_BY:
        raise BadInput(f"family {name!r} is expressed by {fam.expressed_by or 'nothing'}: the search drives "
                       f"{SEARCHED_BY} families only (generated routes are not built yet)")
    unknown = [p for p in fam.parameters if p not in SPLITS and p not in WHICH]
    if unknown:
        raise BadInput(f"family {name!r}: parameter(s) {', '.join(unknown)} map to no tinygrad opt "
                       f"(known: {', '.join([*SPLITS, *WHICH])})")
    if any(v < 1 for p, values in fam.parameters.items() if p in SPLITS for v in values):
        raise BadInput(f"family {name!r}: a split of an axis must be at least 1")
    return fam


def check_knobs(setting, name: str) -> None:
    """A setting whose fields are whole-number knobs of family `name`: each one of the values spaces.toml
    lists for it, or one line naming every field that is not."""
    space = families()[name].parameters
    values = {f.name: getattr(setting, f.name) for f in dataclasses.fields(setting)}
    bad = [f for f, v in values.items() if not (isinstance(v, int) and not isinstance(v, bool) and v in space[f])]
    if bad:
        raise BadInput(f"{name} setting {values}: " + "; ".join(
            f"{f} must be one of {', '.join(map(str, space[f]))}" for f in bad) + f" (spaces.toml, family {name})")


def _rule_breaks(rule: Rule, setting: dict[str, int], fam: Family, target: Target) -> str | None:
    if rule.when is not None and not setting.get(rule.when) or rule.needs and all(setting.get(p, 1) == 1 for p in rule.needs):
        return None
    named = {n: setting[n] if n in setting else fam.constants.get(n, target.fact(n)) for n in rule.product}
    missing = [n for n, v in {**named, rule.fact: target.fact(rule.fact)}.items() if v is None]
    if missing:
        return f"the target declares no {missing[0]}"
    fact = target.fact(rule.fact)
    product = math.prod(named.values())
    ok = {"<=": product <= fact, "multiple_of": product % fact == 0,
          "divides": product != 0 and fact % product == 0}[rule.op]
    return None if ok else f"{rule.fact}: {rule.why}"


def reduce_splits(setting: dict[str, int], kernel: KernelShape) -> dict[str, int] | str:
    """Which reduction axis (its place in the compiler's order) each reduction split takes, or why none can."""
    ranks, placed = kernel.reduce_ranks(), {}
    for which, split in WHICH.items():
        rank = setting.get(which, 0)
        if setting.get(split, 1) == 1:
            if rank:
                return "an axis chosen for no split (the same as the first)"
            continue
        if not ranks:
            return "no reduce axis to split"
        if rank >= len(ranks):
            return "no such reduce axis"
        placed[split] = ranks[rank]
    return placed


def _shape_breaks(setting: dict[str, int], kernel: KernelShape) -> str | None:
    out = math.prod(v for p, v in setting.items() if SPLITS.get(p) == "output")
    if out > 1 and kernel.output is None:
        return "no output axis to split"
    if out > 1 and kernel.output % out:
        return "does not divide the output axis"
    placed = reduce_splits(setting, kernel)
    if isinstance(placed, str):
        return placed
    lengths = kernel.reduce_lengths()
    for axis in set(placed.values()):
        if lengths[axis] % math.prod(setting[p] for p, a in placed.items() if a == axis):
            return "does not divide the reduce axis"
    return None


def on_target(fam: Family, target: Target) -> tuple[list[dict[str, int]], Counter]:
    """Every setting of a family whose rules hold on the target, and the rejected counted by reason
    (a family whose settings fit each shape themselves: no kernel asked)."""
    names, legal, rejected = list(fam.parameters), [], Counter()
    for values in itertools.product(*(fam.parameters[n] for n in names)):
        setting = dict(zip(names, values))
        reason = next((why for r in fam.rules if (why := _rule_breaks(r, setting, fam, target))), None)
        if reason:
            rejected[reason] += 1
        else:
            legal.append(setting)
    return legal, rejected


def propose(kernel: KernelShape, fam: Family, target: Target) -> Space:
    """Every setting of the family for this kernel: legal, or rejected with its reason."""
    names = list(fam.parameters)
    space = Space(kernel, [])
    for values in itertools.product(*(fam.parameters[n] for n in names)):
        setting = dict(zip(names, values))
        reason = _shape_breaks(setting, kernel) or next(
            (why for r in fam.rules if (why := _rule_breaks(r, setting, fam, target))), None)
        if reason:
            space.rejected[reason] += 1
        else:
            space.legal.append(setting)
    return space
