"""The generated route families, listed once: the CLI's flags, the route file's keys, the loader's
installers and the whole-token search's families all come from FAMILIES.

Each family is declared in its own module (family.Family); a new one is that module, its table in
data/spaces.toml, and its line here. The order is the order they are built on the loaded model (a
family that builds on another comes after it) and the order a trace's route label names them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from boltbeam.errors import BadInput
from boltbeam.measure.route import Route, env_off, known_keys
from boltbeam.route import constants, fusion, gemv, half_cache, layout, replay, split_attention
from boltbeam.route.family import Family

FAMILIES: tuple[Family, ...] = (layout.FAMILY, gemv.FAMILY, fusion.FAMILY, constants.FAMILY, half_cache.FAMILY,
                                split_attention.FAMILY, replay.FAMILY)
BY_NAME = {f.name: f for f in FAMILIES}

# What a command line says of the families, a field each by its key: the flag's text (True for a switch),
# overriding the route's own setting; None leaves the route's, and "none" turns the family off.
Flags = dataclasses.make_dataclass("Flags", [(f.key, "str | bool | None", None) for f in FAMILIES], frozen=True)


def of_route(route: Route, path: str) -> dict[str, Any]:
    """The settings of the families a route file sets, by key; a key no family or field of the route
    has is refused, never ignored (a typo would run with its family off)."""
    known_keys(route.families, ["format", "version", *(f.name for f in dataclasses.fields(Route)
                                                         if f.name != "families"), *(f.key for f in FAMILIES)],
               f"route {path}")
    return {f.key: f.read(route.families[f.key], f"route {path}: {f.key}") for f in FAMILIES
            if route.families.get(f.key) not in (None, False)}


def settings(route: tuple[str, Route] | None, flags=Flags()) -> dict[str, Any]:
    """Each family's setting, by key: from its flag, else from the route (path, Route); a family off is left
    out. What a family builds on is checked here: one line before any loading."""
    from_route = of_route(route[1], route[0]) if route else {}
    chosen = {}
    for f in FAMILIES:
        given = getattr(flags, f.key)
        if given == "none":
            continue
        setting = f.from_flag(given) or from_route.get(f.key)
        if setting is not None:
            chosen[f.key] = setting
    if f := unmet(chosen):
        raise BadInput(f"{f.flag} {chosen[f.key].flag} builds on {f.needs.what}: it needs {f.needs.flags}")
    return chosen


def unmet(chosen: Mapping[str, Any]) -> Family | None:
    """The first family of these settings (by key) that builds on what the others do not give it; None where none."""
    return next((f for f in FAMILIES if f.key in chosen and f.needs and not f.needs.holds(chosen)), None)


def built_on(family: Family, chosen: Mapping[str, Any]) -> Family | None:
    """A family of these settings (a route's, whose needs hold) that builds on `family`'s setting: one the others
    would not give what it needs without it; None where none does."""
    return unmet({key: setting for key, setting in chosen.items() if key != family.key})


def stored(chosen: Mapping[str, Any]) -> dict[str, Any]:
    """The settings as a route file keeps them, by key."""
    return {key: setting.stored() for key, setting in chosen.items()}


def labels(chosen: Mapping[str, Any]) -> list[str]:
    """The labels a run with these families (by key) names, in the route label's order."""
    return [f.label for f in FAMILIES if f.key in chosen]


def installers(chosen: Mapping[str, Any]) -> list:
    """The families to build on the loaded model, in order, each (net, census, model path) -> Prepared;
    none when BOLTBEAM_ROUTE=none switches them off."""
    if env_off():
        return []
    return [functools.partial(_install, f.install, chosen[f.key]) for f in FAMILIES if f.key in chosen]


def _install(install, setting, net, census, path):
    """One family's install at its setting (a module-level function, so a fan-out can send it)."""
    return install(net, census, path, setting)
