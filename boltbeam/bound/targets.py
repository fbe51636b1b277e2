"""The target registry: chip facts from boltbeam/data/targets.toml, extra target files, and `host`
(the machine at hand, measured on first use and cached). A new GPU is a data edit."""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from boltbeam.errors import BadInput

STATUSES = ("spec", "measured", "derived")
REQUIRED = ("memory_bandwidth",)
# Facts that may be zero or negative: launch cost per kernel is measured net of the timing's own cost.
SIGNED = ("launch_sync_per_kernel",)
HOST = "host"


@dataclass(frozen=True)
class Fact:
    value: float
    unit: str
    status: str
    source: str
    date: str


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    facts: dict[str, Fact]

    def fact(self, name: str) -> float | None:
        f = self.facts.get(name)
        return None if f is None else f.value

    @property
    def bandwidth_fact(self) -> tuple[str, Fact]:
        """The bandwidth floors use: a measured one where the target has it, else the declared one."""
        name = "measured_bandwidth" if "measured_bandwidth" in self.facts else "memory_bandwidth"
        return name, self.facts[name]

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_fact[1].value

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "facts": {k: vars(f) for k, f in self.facts.items()}}


def _parse(name: str, body: Any, where: str) -> Target:
    if not isinstance(body, dict):
        raise BadInput(f"{where}: target {name!r} must be a table")
    facts = {}
    for key, f in body.items():
        if key == "description":
            continue
        if not isinstance(f, dict) or not {"value", "unit", "status", "source", "date"} <= f.keys() \
                or not all(isinstance(f[k], str) for k in ("unit", "status", "source", "date")):
            raise BadInput(f"{where}: {name}.{key} needs a value and unit, status, source and date as strings")
        if f["status"] not in STATUSES:
            raise BadInput(f"{where}: {name}.{key}: status {f['status']!r} is not one of {', '.join(STATUSES)}")
        if not isinstance(f["value"], (int, float)) or isinstance(f["value"], bool) or not math.isfinite(f["value"]) \
                or (f["value"] <= 0 and key not in SIGNED):
            raise BadInput(f"{where}: {name}.{key}: value must be a {'finite' if key in SIGNED else 'positive'} number")
        facts[key] = Fact(float(f["value"]), str(f["unit"]), f["status"], str(f["source"]), str(f["date"]))
    for key in REQUIRED:
        if key not in facts:
            raise BadInput(f"{where}: target {name!r} lacks the fact {key!r}")
    return Target(name, str(body.get("description", name)), facts)


def _load_file(text: str, where: str) -> dict[str, Target]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{where}: not valid TOML ({e})") from None
    return {name: _parse(name, body, where) for name, body in data.items()}


def host_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "boltbeam" / "host.toml"


def registry(extra_files: list[str] | None = None) -> dict[str, Target]:
    """All declared targets: the packaged file, then any files in --targets or $BOLTBEAM_TARGETS."""
    text = resources.files("boltbeam.data").joinpath("targets.toml").read_text()
    targets = _load_file(text, "targets.toml")
    env = os.environ.get("BOLTBEAM_TARGETS")
    for path in [*(extra_files or []), *(env.split(os.pathsep) if env else [])]:
        p = Path(path)
        if not p.is_file():
            raise BadInput(f"targets file {p}: no such file")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"targets file {p}: unreadable ({e.__class__.__name__})") from None
        targets.update(_load_file(text, str(p)))
    cache = host_cache_path()
    if HOST not in targets and cache.is_file():
        targets.update(_load_file(cache.read_text(), str(cache)))
    return targets


def get_target(name: str, extra_files: list[str] | None = None) -> Target:
    targets = registry(extra_files)
    if name in targets:
        return targets[name]
    if name == HOST:
        from boltbeam.bound.measure_target import measure_host
        return measure_host()
    raise BadInput(f"unknown target {name!r}; known: {', '.join(sorted([*targets, HOST]))}")
