"""BoltBeam's one normalized trace: what every adapter and importer writes, and what account,
compare and judge read. Versioned JSON; `load` validates and raises BadInput with one line.

Layout (version 1)::

  format: "boltbeam-trace", version: 1
  environment: engine, engine_version, device, driver, compiler, compiler_version, host,
               python, command, model_path, model_sha256
  workload:    context (KV depth), tokens (measured), warmup, batch
  route:       label (provenance of what executed), switch (how to turn it off), settings {}
  token_wall_us:        every measured token's wall time as users get it (graph mode), µs
  output_tokens:        the tokens the route produced (for correctness checks), or null
  memory:      peak_bytes, capacity_bytes (either may be null)
  kernel_pass_wall_us:  wall time of each token of the per-kernel pass, µs (may be empty)
  kernels:     one event per kernel launch of the per-kernel pass: token, index, name,
               start_us (from the token's first kernel, one device timeline) or null,
               duration_us, role (weight role or null), category, tensors, bytes, flops,
               global_size, local_size, opts
  provenance:  source ("profile" or "import:KIND"), tool_version, created, inputs
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from boltbeam.errors import BadInput
from boltbeam.files import load_json, write_json

FORMAT = "boltbeam-trace"
VERSION = 1

# What a kernel that moves no weight does; "weights" marks one that reads a weight table.
CATEGORIES = ("weights", "attention", "norm", "rope", "kv_write", "copy", "elementwise",
              "sampling", "other")


@dataclass
class Kernel:
    token: int
    index: int
    name: str
    duration_us: float
    start_us: float | None = None
    role: str | None = None
    category: str = "other"
    tensors: list[str] = field(default_factory=list)
    bytes: int | None = None
    flops: int | None = None
    global_size: list[int] | None = None
    local_size: list[int] | None = None
    opts: list[str] | None = None


@dataclass
class Trace:
    environment: dict[str, Any]
    workload: dict[str, Any]
    route: dict[str, Any]
    token_wall_us: list[float]
    provenance: dict[str, Any]
    output_tokens: list[int] | None = None
    memory: dict[str, Any] = field(default_factory=lambda: {"peak_bytes": None, "capacity_bytes": None})
    kernel_pass_wall_us: list[float] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    def kernels_of_token(self, token: int) -> list[Kernel]:
        return [k for k in self.kernels if k.token == token]

    @property
    def kernel_tokens(self) -> list[int]:
        return sorted({k.token for k in self.kernels})


def _num_list(d: dict, key: str, where: str, allow_empty: bool = True) -> list[float]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise BadInput(f"{where}: '{key}' must be a list of numbers")
    if any(not math.isfinite(x) or x < 0 for x in v):
        raise BadInput(f"{where}: '{key}' holds a negative or non-finite value")
    if not allow_empty and not v:
        raise BadInput(f"{where}: '{key}' is empty")
    return [float(x) for x in v]


def from_dict(d: Any, where: str = "trace") -> Trace:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise BadInput(f"{where}: not a BoltBeam trace (no \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION:
        raise BadInput(f"{where}: trace version {d.get('version')!r} is not supported (want {VERSION})")
    for key in ("environment", "workload", "route", "provenance"):
        if not isinstance(d.get(key), dict):
            raise BadInput(f"{where}: '{key}' must be an object")
    out_tokens = d.get("output_tokens")
    if out_tokens is not None and (not isinstance(out_tokens, list) or not all(isinstance(t, int) for t in out_tokens)):
        raise BadInput(f"{where}: 'output_tokens' must be a list of integers or null")
    kernels = []
    for i, k in enumerate(d.get("kernels") or []):
        try:
            kern = Kernel(**k)
        except TypeError as e:
            raise BadInput(f"{where}: kernel {i}: {e}") from None
        if not isinstance(kern.duration_us, (int, float)) or not math.isfinite(kern.duration_us) or kern.duration_us < 0:
            raise BadInput(f"{where}: kernel {i} ({kern.name}): bad duration_us {kern.duration_us!r}")
        if kern.category not in CATEGORIES:
            raise BadInput(f"{where}: kernel {i} ({kern.name}): unknown category {kern.category!r}")
        kernels.append(kern)
    memory = d.get("memory") or {"peak_bytes": None, "capacity_bytes": None}
    if not isinstance(memory, dict):
        raise BadInput(f"{where}: 'memory' must be an object")
    return Trace(environment=d["environment"], workload=d["workload"], route=d["route"],
                 token_wall_us=_num_list(d, "token_wall_us", where),
                 provenance=d["provenance"], output_tokens=out_tokens, memory=memory,
                 kernel_pass_wall_us=_num_list(d, "kernel_pass_wall_us", where), kernels=kernels)


def load(path: str) -> Trace:
    return from_dict(load_json(path, "trace"), where=f"trace {path}")


def save(trace: Trace, path: str) -> None:
    write_json(path, trace.to_dict())
