"""A depth sweep: the same decode profiled at several KV depths, each in a fresh process, and the token at each
depth by region. What grows with depth is what reads the cache; the rest should stay put."""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from boltbeam.account.compare import label, region_times
from boltbeam.errors import BadInput, Refused
from boltbeam.files import load_json
from boltbeam.measure import trace as tracefile
from boltbeam.units import integer, is_number, is_whole

FORMAT, VERSION = "boltbeam-sweep", 1
MOST_DEPTHS = 16


@dataclass(frozen=True)
class Depth:
    """One depth's decode: its trace, what ran, its median plain token and its kernels by region (per-token
    medians, µs; empty for a trace with whole-token figures only)."""
    context: int
    trace: str
    route: str
    wall_us: float
    regions_us: dict[str, float]
    refusal: str | None = None    # what `profile` refused after writing the trace (e.g. a tensor never read)

    @property
    def tok_s(self) -> float:
        return 1e6 / self.wall_us


@dataclass(frozen=True)
class Sweep:
    model: str
    device: str
    engine: str
    depths: list[Depth]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **asdict(self),
                "tok_s": {d.context: d.tok_s for d in self.depths}}


def parse_contexts(text: str) -> list[int]:
    """--contexts 512,4096,16384: depths of one or more positions, each once, in order."""
    try:
        depths = [integer(p.strip()) for p in text.split(",")]
    except ValueError as e:
        raise BadInput(f"--contexts {text!r}: give depths as whole numbers joined by commas, e.g. 512,4096,16384 "
                       f"({e})") from None
    if any(d < 1 for d in depths):
        raise BadInput(f"--contexts {text!r}: every depth must be at least 1 position")
    if len(set(depths)) != len(depths) or len(depths) > MOST_DEPTHS:
        raise BadInput(f"--contexts {text!r}: each depth once, at most {MOST_DEPTHS} of them")
    return sorted(depths)


def depth_of(trace: tracefile.Trace, path: str) -> Depth:
    context = trace.workload.context
    if not isinstance(context, int):
        raise BadInput(f"{path}: the trace records no KV depth")
    regions = region_times(trace) if trace.kernels else {}
    return Depth(context, path, label(trace), statistics.median(trace.token_wall_us), regions)


def sweep(model: str, device: str, contexts: list[int], out: Path, flags: list[str],
          progress: Callable[[int], None] = lambda context: None) -> Sweep:
    """`boltbeam profile` at each depth in a process of its own (the adapter's hooks go in before tinygrad
    first compiles), its trace written into `out`; a depth with no trace stops the sweep with its reason, one
    whose profile refused after writing its trace keeps the refusal beside its numbers."""
    from boltbeam.measure.tinygrad_run import profile_elsewhere
    depths, engine = [], "tinygrad"
    for context in contexts:
        progress(context)
        path = out / f"trace_{context}.json"
        why = profile_elsewhere(model, device, str(path), "--context", str(context), *flags)
        if why is not None and not path.is_file():
            if why.startswith("boltbeam: error: "):      # the profile's own bad input: the same line, exit 2
                raise BadInput(f"depth {context}: {why.removeprefix('boltbeam: error: ')}")
            raise Refused(f"the profile at depth {context} did not finish: {why}")
        trace = tracefile.load(str(path))
        engine = trace.environment.engine or engine
        depths.append(dataclasses.replace(depth_of(trace, str(path)), refusal=why))
    return Sweep(model, device, engine, depths)


def load(path: str) -> Sweep:
    """A sweep written by `boltbeam sweep` (its sweep.json), to draw beside another."""
    d = load_json(path, "sweep")
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
        raise BadInput(f"{path}: not a BoltBeam sweep (sweep.json of `boltbeam sweep`)")
    try:
        depths = [Depth(x["context"], str(x["trace"]), str(x["route"]), x["wall_us"], dict(x["regions_us"]),
                        None if x.get("refusal") is None else str(x["refusal"])) for x in d["depths"]]
        sweep = Sweep(str(d["model"]), str(d["device"]), str(d["engine"]), depths)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadInput(f"{path}: a malformed sweep ({type(e).__name__}: {e})") from None
    for x in sweep.depths:
        if not (is_whole(x.context) and x.context >= 1):
            raise BadInput(f"{path}: a depth of {x.context!r} positions: depths are whole numbers of at least 1")
        if not (is_number(x.wall_us) and x.wall_us > 0 and all(is_number(v) for v in x.regions_us.values())):
            raise BadInput(f"{path}: depth {x.context}'s token time is not a positive number (or a region's not a number)")
    return sweep
