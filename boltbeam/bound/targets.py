"""The target registry: chip facts from boltbeam/data/targets.toml, extra target files, and `host`
(the machine at hand, measured on first use and cached). A new GPU is a data edit."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from boltbeam import switches
from boltbeam.errors import BadInput
from boltbeam.units import is_number

STATUSES = ("spec", "measured", "derived")
REQUIRED = ("memory_bandwidth",)
# Facts that may be zero or negative: launch cost per kernel is measured net of the timing's own cost.
SIGNED = ("launch_sync_per_kernel",)

# Every unit a fact may be written in: its dimension and its factor to the dimension's base unit.
UNITS = {
    "B/s": ("bandwidth", 1.0), "KB/s": ("bandwidth", 1e3), "MB/s": ("bandwidth", 1e6), "GB/s": ("bandwidth", 1e9),
    "TB/s": ("bandwidth", 1e12), "GiB/s": ("bandwidth", 2.0 ** 30),
    "B": ("bytes", 1.0), "KB": ("bytes", 1e3), "KiB": ("bytes", 2.0 ** 10), "MB": ("bytes", 1e6),
    "MiB": ("bytes", 2.0 ** 20), "GB": ("bytes", 1e9), "GiB": ("bytes", 2.0 ** 30),
    "s": ("time", 1.0), "ms": ("time", 1e-3), "us": ("time", 1e-6), "µs": ("time", 1e-6), "ns": ("time", 1e-9),
    "FLOP/s": ("rate", 1.0), "GFLOP/s": ("rate", 1e9), "TFLOP/s": ("rate", 1e12),
    "count": ("count", 1.0), "threads": ("count", 1.0),
    "USD/h": ("price", 1.0),
}
BASE = {"bandwidth": "B/s", "bytes": "B", "time": "s", "rate": "FLOP/s", "count": "count", "price": "USD/h"}
# The dimension a fact's name asks for (a part of the name -> dimension); other facts take any unit.
DIMENSION_OF = {"bandwidth": "bandwidth", "capacity": "bytes", "local_memory": "bytes", "latency": "time",
                "launch_sync": "time", "peak_": "rate", "matmul": "rate", "multiprocessors": "count",
                "threads": "count", "registers": "count", "width": "count", "price": "price"}
# Where a value, in base units, can lie for any chip: a bandwidth of 4,800 B/s is a unit mistake.
PLAUSIBLE = {"bandwidth": (1e8, 1e15), "bytes": (1.0, 1e15), "time": (1e-10, 10.0), "rate": (1e8, 1e18),
             "count": (1.0, 1e9), "price": (1e-3, 1e4)}
HOST = "host"
FACT_KEYS = {"value", "unit", "status", "source", "date", "engine", "method"}


@dataclass(frozen=True)
class Fact:
    value: float
    unit: str
    status: str
    source: str
    date: str
    engine: str | None = None   # a cost measured through one engine (e.g. its launches) holds for that engine only
    method: str | None = None   # how it was measured, where an account must know (launch_cost.BRACKETED)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    facts: dict[str, Fact]
    device_name: str | None = None   # the name the driver gives the chip; a trace that recorded it needs no --target

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
        if key in ("description", "device_name"):
            continue
        if not isinstance(f, dict) or not {"value", "unit", "status", "source", "date"} <= f.keys() <= FACT_KEYS \
                or not all(isinstance(f[k], str) for k in f.keys() - {"value"}):
            raise BadInput(f"{where}: {name}.{key} needs a value and unit, status, source and date as strings "
                           f"(and may name the engine it was measured through)")
        if f["status"] not in STATUSES:
            raise BadInput(f"{where}: {name}.{key}: status {f['status']!r} is not one of {', '.join(STATUSES)}")
        facts[key] = _fact(f, f"{where}: {name}.{key}", signed=key in SIGNED,
                           dimension=next((d for part, d in DIMENSION_OF.items() if part in key), None))
    for key in REQUIRED:
        if key not in facts:
            raise BadInput(f"{where}: target {name!r} lacks the fact {key!r}")
    device_name = body.get("device_name")
    if device_name is not None and not (isinstance(device_name, str) and device_name.strip()):
        raise BadInput(f"{where}: {name}.device_name must be the driver's name of the chip, as a string")
    return Target(name, str(body.get("description", name)), facts, device_name)


def _fact(f: dict, where: str, signed: bool, dimension: str | None) -> Fact:
    """A fact in its dimension's base unit; the unit is read, never assumed."""
    if f["unit"] not in UNITS:
        raise BadInput(f"{where}: unit {f['unit']!r} is not one BoltBeam reads ({', '.join(UNITS)})")
    dim, factor = UNITS[f["unit"]]
    if dimension and dim != dimension:
        raise BadInput(f"{where}: unit {f['unit']!r} measures {dim}; this fact is a {dimension} "
                       f"(e.g. {BASE[dimension]})")
    v = f["value"]
    # bounded before any conversion (10**309 is one line); past a chip's range, the check below says so
    if not is_number(v, sys.float_info.max) or (v <= 0 and not signed):
        raise BadInput(f"{where}: value must be a {'finite' if signed else 'positive'} number, not {repr(v)[:40]}")
    low, high = PLAUSIBLE[dim]
    if v != 0 and not low <= abs(v * factor) <= high:
        raise BadInput(f"{where}: {v:g} {f['unit']} is outside what any chip has ({low:g} to {high:g} "
                       f"{BASE[dim]}): a unit mistake?")
    return Fact(float(v * factor), BASE[dim], f["status"], f["source"], f["date"], f.get("engine"), f.get("method"))


def _load_file(text: str, where: str) -> dict[str, Target]:
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:   # ValueError: an integer past int()'s 4,300 digits
        raise BadInput(f"{where}: not valid TOML ({str(e)[:200]})") from None
    return {name: _parse(name, body, where) for name, body in data.items()}


def host_cache_path() -> Path:
    # The name changes with the facts `host` declares, so a cache from before them is measured again.
    base = switches.CACHE_HOME.value or Path.home() / ".cache"
    return Path(base) / "boltbeam" / "host-2.toml"


def registry(extra_files: list[str] | None = None) -> dict[str, Target]:
    """All declared targets: the packaged file, then any files in --targets or $BOLTBEAM_TARGETS."""
    text = resources.files("boltbeam.data").joinpath("targets.toml").read_text()
    targets = _load_file(text, "targets.toml")
    env = switches.TARGETS.value
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
        return measure_host_apart()
    raise BadInput(f"unknown target {name!r}; known: {', '.join(sorted({*targets, HOST}))}")


def target_of(device_name: str | None, device: str | None = None, host: str | None = None,
              extra_files: list[str] | None = None) -> Target:
    """The target a trace ran on, from what its environment recorded: the declared target whose device_name is
    the chip's name (an engine may add the driver's version after a comma), or `host` for a CPU trace taken on
    this machine; else the user must say."""
    name = device_name or ""
    declared = [t for t in registry(extra_files).values() if t.device_name == name.split(",")[0].strip()]
    if len(declared) == 1:
        return declared[0]
    if device == "CPU" and host == platform.node():
        return get_target(HOST, extra_files)
    raise BadInput(f"the trace ran on {name or 'a device it did not name'}, which "
                   f"{'several targets declare' if declared else 'no target declares as its device_name'}: pass --target")


def measure_host_apart() -> Target:
    """`host` measured once, in a child process on the CPU, and cached. Measured here, tinygrad would already
    be running in this process when a later `profile` installs its recorder, which then misses the token."""
    cache = host_cache_path()
    print(f"boltbeam: measuring this machine's memory once (cached in {cache})", file=sys.stderr)
    child = subprocess.run([sys.executable, "-m", "boltbeam.bound.measure_target"], env={**os.environ, switches.DEV.name: "CPU"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if child.returncode != 0 or not cache.is_file():
        said = child.stderr.strip().splitlines()
        raise BadInput(f"measuring the host failed: {said[-1] if said else f'exit {child.returncode}'}")
    return _load_file(cache.read_text(), str(cache))[HOST]
