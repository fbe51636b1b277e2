"""Chrome trace JSON as torch.profiler (Kineto) writes it: `{"traceEvents": [...]}` or a bare list.

GPU work is the complete ("ph": "X") events of the GPU categories; ts and dur are µs. Tokens come
from user annotations whose name matches a marker, or from a count the user gives.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any

from boltbeam.errors import BadInput
from boltbeam.files import load_json
from boltbeam.measure.importers.common import (DEFAULT_TOKEN_MARKER, Span, extent_us, kernel_trace,
                                               split_by_spans, split_evenly)
from boltbeam.measure.trace import CATEGORIES, Kernel, Trace

# Category spellings across Kineto versions (older PyTorch wrote "Kernel", "Memcpy", "Runtime").
KERNEL_CATS = {"kernel", "Kernel", "gpu_op"}
COPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
ANNOTATION_CAT = "user_annotation"  # record_function spans on the host: the wall as the caller saw it
# Kernel fields an event's args may carry (BoltBeam's own export writes them).
KERNEL_ARGS = ("role", "tensors", "bytes", "flops", "opts")


def read_events(path: str | os.PathLike) -> tuple[list[dict[str, Any]], str | None]:
    """The trace's events, and the GPU's name when Kineto recorded deviceProperties."""
    data = load_json(path, "Chrome trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise BadInput(f"Chrome trace {path}: expected {{\"traceEvents\": [...]}} or a list of events")
    props = data.get("deviceProperties") if isinstance(data, dict) else None
    device = props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None
    events = [e for e in events if isinstance(e, dict)]
    for i, e in enumerate(events):   # the fields every reader below relies on, checked once
        for key in ("ph", "cat", "name"):
            if e.get(key) is not None and not isinstance(e[key], str):
                raise BadInput(f"Chrome trace {path}: event {i}: '{key}' must be a string, not {e[key]!r:.40}")
        if e.get("args") is not None and not isinstance(e["args"], dict):
            raise BadInput(f"Chrome trace {path}: event {i}: 'args' must be an object")
    return events, device if isinstance(device, str) else None


def _number(event: dict[str, Any], key: str, where: str) -> float:
    v = event.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise BadInput(f"{where}: event {event.get('name')!r} has no valid '{key}' ({v!r})")
    return float(v)


def _dims(v: Any) -> list[int] | None:
    if isinstance(v, list) and 1 <= len(v) <= 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def gpu_activity(events: list[dict[str, Any]], where: str) -> list[tuple[Kernel, dict[str, Any]]]:
    """Every GPU kernel, copy and memset as a Kernel (absolute start_us), with its event's args."""
    gpu_cats = KERNEL_CATS | COPY_CATS | MEMSET_CATS
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in gpu_cats:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        category = args.get("category")
        if category not in CATEGORIES:
            category = "copy" if e["cat"] in COPY_CATS else "other"
        kernel = Kernel(token=0, index=0, name=str(e.get("name", "")),
                        duration_us=_number(e, "dur", where), start_us=_number(e, "ts", where),
                        category=category,
                        global_size=_dims(args.get("grid", args.get("global_size"))),
                        local_size=_dims(args.get("block", args.get("local_size"))),
                        **{k: args[k] for k in KERNEL_ARGS if args.get(k) is not None})
        out.append((kernel, args))
    return sorted(out, key=lambda pair: pair[0].start_us)


def token_spans(events: list[dict[str, Any]], marker: str, where: str) -> list[Span]:
    """The host-side annotation spans whose name matches `marker`, in time order."""
    try:
        pattern = re.compile(marker, re.IGNORECASE)
    except re.error as e:
        raise BadInput(f"--token-marker {marker!r} is not a valid regular expression ({e})") from None
    spans = sorted(Span(_number(e, "ts", where), _number(e, "dur", where))
                   for e in events if e.get("ph") == "X" and e.get("cat") == ANNOTATION_CAT
                   and pattern.search(str(e.get("name", ""))))
    for a, b in zip(spans, spans[1:]):
        if b.start_us < a.end_us:
            raise BadInput(f"{where}: token annotations matching {marker!r} overlap (at ts {b.start_us}); "
                           "narrow --token-marker")
    return spans


def launch_times_us(activity: list[tuple[Kernel, dict[str, Any]]], events: list[dict[str, Any]]) -> list[float]:
    """When each kernel was launched (its runtime call, joined on args.correlation), else its GPU
    start. A token owns the kernels launched inside its annotation: they may run after it ends."""
    launched = {_correlation(e.get("args")): e.get("ts") for e in events if e.get("cat") in LAUNCH_CATS}
    launched.pop(None, None)
    times = []
    for kernel, args in activity:
        t = launched.get(_correlation(args))
        times.append(float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else kernel.start_us)
    return times


def _correlation(args: Any) -> int | None:
    corr = args.get("correlation") if isinstance(args, dict) else None
    return corr if isinstance(corr, int) else None


def import_chrome_trace(path: str | os.PathLike, tokens: int | None = None,
                        token_marker: str = DEFAULT_TOKEN_MARKER, engine: str | None = None,
                        context: int | None = None, batch: int | None = None) -> Trace:
    where = f"Chrome trace {path}"
    events, device = read_events(path)
    activity = gpu_activity(events, where)
    if not activity:
        raise BadInput(f"{where}: no GPU kernel events (\"ph\": \"X\", \"cat\": "
                       f"{'/'.join(sorted(KERNEL_CATS))})")
    kernels = [k for k, _ in activity]
    spans = token_spans(events, token_marker, where)
    notes = []
    extra: dict[str, Any] = {}
    if spans:
        if tokens is not None and tokens != len(spans):
            raise BadInput(f"{where}: --tokens {tokens} but {len(spans)} annotations match {token_marker!r}")
        groups, outside = split_by_spans(kernels, launch_times_us(activity, events), spans)
        if outside == len(kernels):
            raise BadInput(f"{where}: no GPU kernel falls inside a token annotation matching {token_marker!r}")
        walls = [s.duration_us for s in spans]
        notes.append(f"tokens: {ANNOTATION_CAT} spans matching {token_marker!r}, each owning the kernels "
                     "launched inside it; token walls are the spans' durations")
        extra["kernels_outside_tokens"] = outside
    elif tokens is not None:
        groups = split_evenly(kernels, tokens, where)
        walls = [extent_us(g) for g in groups]
        notes.append(f"tokens: {tokens} equal kernel counts; token walls run from the first kernel's "
                     "start to the last kernel's end (no host time around them)")
    else:
        raise BadInput(f"{where}: no user annotation matches {token_marker!r}; pass --tokens K or "
                       "--token-marker REGEX")
    return kernel_trace(groups, walls, kind="chrome", path=path, notes=notes, engine=engine,
                        device=device, context=context, batch=batch, **extra)
