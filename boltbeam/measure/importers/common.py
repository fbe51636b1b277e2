"""What the importers share: provenance, and dividing a run's GPU activity into decode tokens.

Every importer first turns its file into a list of Kernels whose start_us is absolute (the source's
own clock); `kernel_trace` then numbers them per token and makes start_us relative to each token's
first kernel, as the trace format says.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from boltbeam import __version__
from boltbeam.errors import BadInput
from boltbeam.files import sha256_file
from boltbeam.measure.trace import Environment, Kernel, Provenance, RouteRecord, Trace, Workload, from_dict

# Matches user annotations such as "token 3", "decode_token_3" or "decode_step".
DEFAULT_TOKEN_MARKER = r"token|decode_step"


@dataclass(frozen=True, order=True)
class Span:
    """One token's wall span on the source's clock, µs."""
    start_us: float
    duration_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


def provenance(kind: str, path: str | os.PathLike, notes: list[str], **extra: Any) -> Provenance:
    return Provenance(f"import:{kind}", __version__, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      inputs=[{"path": str(path), "sha256": sha256_file(path)}], notes=notes, **extra)


def validated(trace: Trace, where: str) -> Trace:
    """Pass the trace through the loader's checks, so an import never writes what `load` refuses."""
    return from_dict(trace.to_dict(), where=where)


def split_evenly(activity: list[Kernel], tokens: int, where: str) -> list[list[Kernel]]:
    """K tokens by equal kernel counts: only safe when every token launches the same kernels."""
    if tokens < 1:
        raise BadInput(f"{where}: --tokens must be at least 1, got {tokens}")
    if len(activity) % tokens:
        raise BadInput(f"{where}: {len(activity)} GPU operations do not divide into {tokens} equal tokens")
    per = len(activity) // tokens
    return [activity[i * per:(i + 1) * per] for i in range(tokens)]


def split_by_spans(activity: list[Kernel], match_us: list[float],
                   spans: list[Span]) -> tuple[list[list[Kernel]], int]:
    """Each kernel goes to the span holding its match time (half-open, so adjacent spans share no
    kernel). Returns the groups, one per span, and how many kernels fell outside every span."""
    groups: list[list[Kernel]] = [[] for _ in spans]
    outside = 0
    for kernel, t in zip(activity, match_us):
        token = next((i for i, s in enumerate(spans) if s.start_us <= t < s.end_us), None)
        if token is None:
            outside += 1
        else:
            groups[token].append(kernel)
    return groups, outside


def extent_us(group: list[Kernel]) -> float:
    """First kernel start to last kernel end: a token's wall when nothing marks it."""
    if not group:
        return 0.0
    return max(k.start_us + k.duration_us for k in group) - min(k.start_us for k in group)


def _ns(us: float) -> float:
    """Round to the nanosecond: no profiler resolves finer, and subtracting large clock values
    leaves float noise below it."""
    return round(us, 3)


def kernel_trace(groups: list[list[Kernel]], walls_us: list[float], *, kind: str,
                 path: str | os.PathLike, notes: list[str], engine: str | None, device: str | None,
                 context: int | None, batch: int | None, **provenance_extra: Any) -> Trace:
    """A trace from per-token kernel groups (absolute start_us) and each token's wall.

    The profiled run is the per-kernel pass, so its walls fill both token_wall_us and
    kernel_pass_wall_us: an imported profile has no separate unprofiled run.
    """
    kernels = []
    for token, group in enumerate(groups):
        first = min((k.start_us for k in group), default=0.0)
        ordered = sorted(group, key=lambda k: k.start_us)
        kernels += [dataclasses.replace(k, token=token, index=i, start_us=_ns(k.start_us - first),
                                        duration_us=_ns(k.duration_us)) for i, k in enumerate(ordered)]
    walls_us = [_ns(w) for w in walls_us]
    trace = Trace(
        environment=Environment(engine=engine, device=device),
        workload=Workload(context, len(groups), batch=batch),
        route=RouteRecord(engine or f"import:{kind}"),
        token_wall_us=walls_us, kernel_pass_wall_us=list(walls_us), kernels=kernels,
        provenance=provenance(kind, path, notes, **provenance_extra))
    return validated(trace, f"{kind} {path}")
