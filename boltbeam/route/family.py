"""What a generated route family declares, once, in its own module of route/ (families.py lists them).

A family's module holds its settings type, its installer, FutureSight's term for it and what rules a
setting out; its `FAMILY = Family(...)` hands all of them on. The CLI's flags, the route file's keys,
the loader and the whole-token search read every family through that declaration, never by name.

A settings type is a frozen dataclass with `flag` (its text on the command line) and `stored()` (its
data in a route file); the declaration says how one is made from a flag (`parse`), from a route file
(`read`, with `knobs` or `switch` below) and from its parameters' values in data/spaces.toml
(`of_values`). A switch family (one setting, on or off) has a flag without a value. What a family's
settings run in place of what a route without it runs, as a profile of that route records it (`replaces`),
prices the family before the route sets it (tune's order).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from boltbeam.errors import BadInput

if TYPE_CHECKING:
    from boltbeam.measure.prepared import Prepared
    from boltbeam.foresight.future import Foreseen


@dataclass(frozen=True)
class Needs:
    """What a family builds on, which the other families' settings must give it."""
    what: str                                    # e.g. "the layout's generated kernel"
    flags: str                                   # how a command line gives it
    route: str                                   # how a route gives it
    holds: Callable[[Mapping[str, Any]], bool]   # whether these settings (by family key) give it


@dataclass(frozen=True)
class Replaces:
    """What a family's settings take over from a route that sets none of them, as a profile of that route records
    it: the kernels of account's regions (account/compare.py's REGIONS), the kernels of trace categories outside
    those regions (trace.CATEGORIES), and the host's step before a token's first kernel."""
    regions: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    host: bool = False


@dataclass(frozen=True)
class Family:
    """One generated family: everything the rest of BoltBeam needs of it."""
    name: str                                    # its table in data/spaces.toml; `search --family NAME`
    label: str                                   # what it adds to a trace's route label
    key: str                                     # its key in a route file; its flag is --KEY ('-' for '_')
    help: str                                    # its flag's help
    install: Callable[..., Prepared]             # (net, census, model path, setting): built on the loaded model
    read: Callable[[Any, str], Any]              # a setting from a route file's data (where: for the one line)
    of_values: Callable[[dict[str, int]], Any]   # a setting from its parameters' values in spaces.toml
    foresee: Callable[..., Foreseen]             # FutureSight: (census, setting, context, target, calibration,
                                                 #   the settings it goes on, by family key)
    metavar: str | None = None                   # its flag's form; None: a switch, its one setting on or off
    parse: Callable[[str], Any] | None = None    # a setting from its flag's text (not for a switch)
    needs: Needs | None = None                   # what it builds on
    admits: Callable[[dict[str, int]], bool] = lambda values: True    # whether spaces.toml's values make a setting
    unfit: Callable[[Any, Any], str | None] = lambda census, setting: None   # why the model's shape cannot take one
    replaces: Replaces | None = None             # None: nothing a profile records prices it

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def flags(self, setting) -> list[str]:
        """The profile flags that build `setting`."""
        return [self.flag] if self.metavar is None else [self.flag, setting.flag]

    def from_flag(self, given: str | bool | None):
        """The setting a command line gives (None: it gives none)."""
        if not given:
            return None
        return self.read(True, self.flag) if self.metavar is None else self.parse(given)

    def refuses(self, settings: Mapping[str, Any]) -> str | None:
        """Why a route with these settings (by family key) cannot take the family, for the search (None: it can)."""
        if self.needs and not self.needs.holds(settings):
            return f"the {self.name} family builds on {self.needs.what}: search it --on {self.needs.route}"
        return None


def knobs(kind, later: tuple[str, ...] = ()) -> Callable[[Any, str], Any]:
    """A reader of a route file's table of the dataclass `kind`'s fields. The fields in `later` came after
    the first route files were written: a route without them runs them off."""
    keys = [f.name for f in dataclasses.fields(kind)]
    required = [k for k in keys if k not in later]

    def read(data, where: str):
        if not isinstance(data, dict):
            raise BadInput(f"{where} must be a table ({', '.join(keys)}) or null")
        if not set(required) <= set(data) <= set(keys):
            raise BadInput(f"{where} {data}: expected the keys {', '.join(required)}"
                           + (f" (and {', '.join(later)}, which may be left out)" if later else ""))
        return kind(**data)
    return read


@dataclass(frozen=True)
class Switch:
    """The one setting of a switch family (on or off): a subclass names its table of data/spaces.toml (SPACE) and
    declares its one knob as its one field, 1 by default; the knob's name is its flag's text."""
    SPACE: ClassVar[str]

    def __post_init__(self):
        from boltbeam.foresight.space import check_knobs
        check_knobs(self, self.SPACE)

    @property
    def flag(self) -> str:
        return dataclasses.fields(self)[0].name

    def stored(self) -> bool:
        return True


def after_init_state(net, then: Callable[[Any], None]) -> int:
    """Have each block of `net` call then(block) right after its own state initialisation (tinygrad.llm's hook,
    called on every step: its cache and rotary table made on the first); the blocks wrapped."""
    wrapped = 0
    for block in getattr(net, "blk", []):
        init = getattr(block, "_init_state", None)
        if init is None:
            continue

        def init_then(x, init=init, block=block):
            init(x)
            then(block)
        block._init_state = init_then
        wrapped += 1
    return wrapped


def switch(kind) -> Callable[[Any, str], Any]:
    """A reader of a switch family's route data: true builds its one setting."""
    def read(data, where: str):
        if data is not True:
            raise BadInput(f"{where} must be true or false")
        return kind()
    return read


def thread_group_limit(needs: str) -> int:
    """The most threads a group may hold on the default device, for a generated kernel that runs thread
    groups with local memory (`needs` names it); one line where the device has none."""
    from tinygrad import Device
    renderer = Device[Device.DEFAULT].renderer
    if not renderer.has_local:
        raise BadInput(f"{needs}: the generated kernel runs thread groups with local memory; device "
                       f"{Device.DEFAULT} has none")
    return renderer.local_max[0] if renderer.local_max else 2 ** 31 - 1
