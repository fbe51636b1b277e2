"""A BoltBeam trace as Chrome trace event JSON, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process; kernels on one track, one span per token on another. Tokens are laid end to end:
each starts where the previous one's kernel-pass wall (or, without one, its kernel span) ended.
The token spans use Kineto's "user_annotation" category, so `boltbeam import chrome` reads an
export back.
"""
from __future__ import annotations

import json
import os
from typing import Any

from boltbeam.files import write_atomic
from boltbeam.measure.trace import Kernel, Trace

PID, KERNEL_TID, TOKEN_TID = 1, 1, 2


def kernel_offsets_us(kernels: list[Kernel]) -> list[float]:
    """Each kernel's start from its token's start: its own start_us, or, when the trace lacks
    device times, launches laid back to back in index order."""
    if all(k.start_us is not None for k in kernels):
        return [k.start_us for k in kernels]
    offsets, t = [], 0.0
    for k in kernels:
        offsets.append(t)
        t += k.duration_us
    return offsets


def token_layout(trace: Trace) -> list[tuple[int, float, list[tuple[Kernel, float]]]]:
    """(token, length µs, [(kernel, offset µs)]) per token, in order. A token's length is its
    kernel-pass wall when the trace has one per token, never shorter than its kernels' span."""
    groups = trace.by_token()
    if not groups:  # whole-token figures only (e.g. llama-bench): spans from token_wall_us
        return [(i, wall, []) for i, wall in enumerate(trace.token_wall_us)]
    walls = trace.kernel_pass_wall_us if len(trace.kernel_pass_wall_us) == len(groups) else None
    layout = []
    for i, (token, kernels) in enumerate(groups.items()):
        placed = list(zip(kernels, kernel_offsets_us(kernels)))
        span = max(offset + k.duration_us for k, offset in placed)
        layout.append((token, max(walls[i], span) if walls else span, placed))
    return layout


def _metadata(name: str, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": PID, "tid": tid, "args": {"name": value}}


def chrome_events(trace: Trace) -> list[dict[str, Any]]:
    env = trace.environment
    title = " | ".join(str(v) for v in (env.engine, trace.route.label, env.device) if v)
    events = [_metadata("process_name", 0, f"BoltBeam: {title or 'trace'}"),
              _metadata("thread_name", KERNEL_TID, "kernels"),
              _metadata("thread_name", TOKEN_TID, "tokens")]
    base = 0.0
    for token, length, placed in token_layout(trace):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"token {token}", "pid": PID,
                       "tid": TOKEN_TID, "ts": base, "dur": length, "args": {"token": token}})
        for k, offset in placed:
            events.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": PID, "tid": KERNEL_TID,
                           "ts": base + offset, "dur": k.duration_us,
                           "args": {"token": k.token, "index": k.index, "role": k.role,
                                    "category": k.category, "bytes": k.bytes, "flops": k.flops,
                                    "global_size": k.global_size, "local_size": k.local_size,
                                    "opts": k.opts, "tensors": k.tensors}})
        base += length
    return events


def chrome_trace(trace: Trace) -> dict[str, Any]:
    other = {"source": trace.provenance.source, "engine": trace.environment.engine,
             "device": trace.environment.device, "route": trace.route.label}
    return {"traceEvents": chrome_events(trace), "displayTimeUnit": "ns",
            "otherData": {k: str(v) for k, v in other.items() if v is not None}}


def write_chrome(trace: Trace, path: str | os.PathLike) -> dict[str, Any]:
    """Write the export atomically; returns what was written."""
    doc = chrome_trace(trace)
    write_atomic(path, json.dumps(doc) + "\n")
    return doc
