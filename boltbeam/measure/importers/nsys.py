"""Nsight Systems `nsys stats --report cuda_gpu_trace --format csv`: one row per kernel, memcpy or
memset. Columns are found by header name, since nsys versions name and unit them differently
("Start (ns)" or "Start", "Name" or "Kernel Name", grid and block columns present or not)."""
from __future__ import annotations

import csv
import os
import re

from boltbeam.errors import BadInput
from boltbeam.measure.importers.common import extent_us, kernel_trace, split_evenly
from boltbeam.measure.trace import Kernel, Trace

# nsys 2021 wrote "Start(sec)" and "Duration(nsec)"; later versions "Start (ns)", per --timeunit.
US_PER_UNIT = {"ns": 1e-3, "nsec": 1e-3, "us": 1.0, "usec": 1.0, "µs": 1.0, "ms": 1e3, "msec": 1e3,
               "s": 1e6, "sec": 1e6}
HEADER_CELL = re.compile(r"^\s*(?P<name>.*?)\s*(?:\((?P<unit>[^)]*)\))?\s*$", re.DOTALL)   # a quoted cell may hold newlines
COLUMN_NAMES = {"start": ("start",), "duration": ("duration",), "name": ("name", "kernel name"),
                "device": ("device",)}
GRID, BLOCK = ("grdx", "grdy", "grdz"), ("blkx", "blky", "blkz")


def _columns(header: list[str]) -> dict[str, tuple[int, str]]:
    """Lower-cased column name -> (index, unit); a bare time column is in nsys's default unit, ns."""
    cols = {}
    for i, cell in enumerate(header):
        m = HEADER_CELL.match(cell.lstrip("\ufeff"))
        cols[m["name"].lower()] = (i, (m["unit"] or "ns").strip().lower())
    return cols


def _find(cols: dict[str, tuple[int, str]], role: str) -> tuple[int, str] | None:
    return next((cols[n] for n in COLUMN_NAMES[role] if n in cols), None)


def _time_column(cols: dict[str, tuple[int, str]], role: str, where: str) -> tuple[int, float]:
    """(index, µs per unit) of the Start or Duration column."""
    col = _find(cols, role)
    if col is None:
        raise BadInput(f"{where}: the header has no {role.title()} column")
    if col[1] not in US_PER_UNIT:
        raise BadInput(f"{where}: the {role.title()} column's unit {col[1]!r} is not one of {', '.join(US_PER_UNIT)}")
    return col[0], US_PER_UNIT[col[1]]


def _size(row: list[str], cols: dict[str, tuple[int, str]], names: tuple[str, ...]) -> list[int] | None:
    cells = [row[cols[n][0]].strip() if n in cols and cols[n][0] < len(row) else "" for n in names]
    return [int(c) for c in cells] if all(cells) else None


def read_gpu_trace(path: str | os.PathLike) -> tuple[list[Kernel], str | None]:
    """Every row as a Kernel (absolute start_us, sorted), and the device the first row names."""
    where = f"nsys CSV {path}"
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = [r for r in csv.reader(f) if any(c.strip() for c in r)]
    except FileNotFoundError:
        raise BadInput(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise BadInput(f"{where}: unreadable ({e.__class__.__name__}: {e})") from None
    # `nsys stats` may print progress lines before the table: the header is the first row with Start.
    at = next((i for i, r in enumerate(rows) if _find(_columns(r), "start")), None)
    if at is None:
        raise BadInput(f"{where}: no header row with a Start column; not a cuda_gpu_trace CSV")
    cols = _columns(rows[at])
    start, duration = _time_column(cols, "start", where), _time_column(cols, "duration", where)
    name = _find(cols, "name")
    if name is None:
        raise BadInput(f"{where}: the header has no Name column")
    device_col = _find(cols, "device")
    kernels = []
    for n, row in enumerate(rows[at + 1:], start=1):
        try:
            t0, dur = float(row[start[0]]) * start[1], float(row[duration[0]]) * duration[1]
            label = row[name[0]]
            grid, block = _size(row, cols, GRID), _size(row, cols, BLOCK)
        except (IndexError, ValueError):
            raise BadInput(f"{where}: table row {n}: a Start, Duration, Name or grid/block cell is "
                           "missing or not a number") from None
        # Copies and memsets launch no grid; of those only a memcpy moves data between buffers.
        category = "copy" if grid is None and "memcpy" in label.lower() else "other"
        kernels.append(Kernel(token=0, index=0, name=label, duration_us=dur, start_us=t0,
                              category=category, global_size=grid, local_size=block))
    if not kernels:
        raise BadInput(f"{where}: the table has no rows")
    device = None
    if device_col and device_col[0] < len(rows[at + 1]):
        device = re.sub(r"\s*\(\d+\)$", "", rows[at + 1][device_col[0]]) or None  # "NVIDIA H200 (0)"
    return sorted(kernels, key=lambda k: k.start_us), device


def import_nsys_gpu_trace(path: str | os.PathLike, tokens: int, engine: str | None = None,
                          context: int | None = None, batch: int | None = None) -> Trace:
    """The cuda_gpu_trace table carries no token marks, so the user says how many tokens it holds."""
    kernels, device = read_gpu_trace(path)
    groups = split_evenly(kernels, tokens, f"nsys CSV {path}")
    notes = [f"tokens: {tokens} equal counts of GPU operations (kernels, copies, memsets); token walls "
             "run from the first one's start to the last one's end (no host time around them)"]
    return kernel_trace(groups, [extent_us(g) for g in groups], kind="nsys", path=path, notes=notes,
                        engine=engine, device=device, context=context, batch=batch)
