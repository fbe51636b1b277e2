"""Floors by physics, before anything runs: per tensor, per role and per decode step.

floor = max(bytes / memory bandwidth, operations / peak rate of the unit the format's math uses).
A decode step of batch B reads every weight table once and does B times the arithmetic; the KV
cache is read per sequence, at most a block's sliding window deep, for its KV heads only.
"""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.read.census import Census, TensorEntry
from boltbeam.read.roles import read_kind

ACTIVATION_BYTES = 4   # tinygrad and llama.cpp keep the hidden state in float32 between kernels


@cache
def formats() -> dict[str, dict[str, Any]]:
    return tomllib.loads(resources.files("boltbeam.data").joinpath("formats.toml").read_text())


@dataclass
class Line:
    """One line of the bound: a tensor, a role, or a non-weight part of the step."""
    role: str
    bytes: int
    flops: int
    unit: str
    floor_memory_us: float
    floor_compute_us: float
    count: int = 1
    name: str | None = None
    format: str | None = None
    crossover_batch: float | None = None   # batch at which this line turns compute-bound

    @property
    def floor_us(self) -> float:
        return max(self.floor_memory_us, self.floor_compute_us)

    @property
    def limit(self) -> str:
        return "compute" if self.floor_compute_us > self.floor_memory_us else "memory"

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(floor_us=self.floor_us, limit=self.limit,
                 intensity=None if not self.bytes else self.intensity)
        return d


@dataclass
class Bound:
    target: str
    bandwidth_bytes_per_s: float
    bandwidth_fact: str
    context: int
    batch: int
    kv_bytes_per_element: int
    roles: list[Line]
    tensors: list[Line]
    notes: list[str] = field(default_factory=list)

    @property
    def step_floor_us(self) -> float:
        return sum(r.floor_us for r in self.roles)

    @property
    def token_floor_us(self) -> float:
        return self.step_floor_us / self.batch

    @property
    def ceiling_tok_s(self) -> float:
        return 1e6 / self.token_floor_us

    @property
    def bytes_per_step(self) -> int:
        return sum(r.bytes for r in self.roles)

    def role(self, name: str) -> Line:
        return next(r for r in self.roles if r.role == name)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "bandwidth_fact": self.bandwidth_fact, "context": self.context, "batch": self.batch,
                "kv_bytes_per_element": self.kv_bytes_per_element,
                "roles": [r.to_dict() for r in sorted(self.roles, key=lambda r: -r.floor_us)],
                "tensors": [t.to_dict() for t in self.tensors],
                "bytes_per_step": self.bytes_per_step, "step_floor_us": self.step_floor_us,
                "token_floor_us": self.token_floor_us, "ceiling_tok_s": self.ceiling_tok_s,
                "notes": self.notes}


def _unit(target: Target, fmt: str, batch: int) -> tuple[str, float | None]:
    spec = formats().get(fmt)
    if spec is None:
        raise Refused(f"format {fmt} has no entry in formats.toml: no unit to bound its math with")
    unit = spec["decode_unit"] if batch == 1 else spec["batched_unit"]
    rate = target.fact(unit)
    if rate is None and unit != "peak_fp32":   # fall back to the vector unit when no matrix-unit fact is declared
        unit, rate = "peak_fp32", target.fact("peak_fp32")
    return unit, rate


def _line(role: str, nbytes: int, flops: int, unit: str, rate: float | None, bw: float, **kw) -> Line:
    return Line(role=role, bytes=nbytes, flops=flops, unit=unit, floor_memory_us=nbytes / bw * 1e6,
                floor_compute_us=flops / rate * 1e6 if rate else 0.0, **kw)


def _tensor_flops(t: TensorEntry, census: Census, batch: int) -> int:
    kind = read_kind(t.role)
    if kind in ("row", "vector"):
        return 0 if kind == "row" else 2 * t.elements * batch   # a scale (and its sum) per element
    flops = 2 * t.elements * batch
    if kind == "experts" and census.facts.expert_count and census.facts.expert_used:
        flops = flops * census.facts.expert_used // census.facts.expert_count
    return flops


def _tensor_bytes(t: TensorEntry, census: Census, batch: int) -> int:
    kind = read_kind(t.role)
    if kind == "row":
        return t.bytes_per_token * batch
    if kind == "experts" and census.facts.expert_count and census.facts.expert_used:
        used = min(census.facts.expert_count, census.facts.expert_used * batch)
        return t.bytes * used // census.facts.expert_count
    return t.bytes_per_token


def bound(census: Census, target: Target, context: int = 0, batch: int = 1,
          kv_bytes_per_element: int = 2) -> Bound:
    if context < 0 or batch < 1 or kv_bytes_per_element < 1:
        raise BadInput("context must be >= 0, batch >= 1 and KV bytes per element >= 1")
    bw_name, bw_fact = target.bandwidth_fact
    bw = bw_fact.value
    notes = [f"bandwidth: {bw_name} = {bw / 1e9:,.1f} GB/s ({bw_fact.status}, {bw_fact.source})"]
    if census.unclassified:
        notes.append(f"adapter-incomplete: {len(census.unclassified)} unclassified tensor(s) bounded as whole tables")

    tensors: list[Line] = []
    for t in census.tensors:
        unit, rate = _unit(target, t.format, batch)
        nbytes, flops = _tensor_bytes(t, census, batch), _tensor_flops(t, census, batch)
        cross = None
        if flops and read_kind(t.role) in ("table", "experts"):
            # Weights are read once per step whatever the batch while the arithmetic grows with it,
            # on the batched unit: past this batch (or prefill length) the table is compute-bound.
            batched_rate = _unit(target, t.format, 2)[1]
            if batched_rate:
                cross = (t.bytes_per_token / bw) / (flops / batch / batched_rate)
        tensors.append(_line(t.role or "unclassified", nbytes, flops, unit, rate, bw, name=t.name,
                             format=t.format, crossover_batch=cross))

    roles: dict[str, Line] = {}
    batched: dict[str, list[float]] = {}   # role -> [memory µs, batched compute µs per sequence] of its tables
    for tl in tensors:
        r = roles.get(tl.role)
        if r is None:
            roles[tl.role] = Line(tl.role, tl.bytes, tl.flops, tl.unit, tl.floor_memory_us, tl.floor_compute_us,
                                  count=1, format=tl.format)
        else:
            r.bytes += tl.bytes
            r.flops += tl.flops
            r.floor_memory_us += tl.floor_memory_us
            r.floor_compute_us += tl.floor_compute_us
            r.count += 1
            if r.format != tl.format:
                r.format = "mixed"
        if tl.crossover_batch is not None:
            acc = batched.setdefault(tl.role, [0.0, 0.0])
            acc[0] += tl.floor_memory_us
            acc[1] += tl.floor_memory_us / tl.crossover_batch
    # A role turns compute-bound once its summed batched arithmetic outgrows its summed bytes.
    for role, (memory_us, compute_us) in batched.items():
        roles[role].crossover_batch = memory_us / compute_us

    f = census.facts
    fp32 = target.fact("peak_fp32")
    if f.blocks and f.kv_heads and f.head_dim:
        depths = [min(context, f.sliding_window) if b in f.swa_blocks and f.sliding_window else context
                  for b in range(f.blocks)]
        kv_row = f.kv_heads * (f.head_dim + f.value_dim) * kv_bytes_per_element   # K and V of one position
        kv_read = sum(depths) * kv_row * batch
        kv_write = f.blocks * kv_row * batch
        attn_flops = 2 * sum(depths) * f.heads * (f.head_dim + f.value_dim) * batch
        roles["kv_cache"] = _line("kv_cache", kv_read + kv_write, attn_flops, "peak_fp32", fp32, bw)
        if f.swa_blocks and f.sliding_window:
            notes.append(f"sliding window {f.sliding_window} on {len(f.swa_blocks)} of {f.blocks} blocks")
    else:
        notes.append("the file lacks head counts or head size: KV cache not bounded")
    # Every weight table's input is read and output written once per sequence.
    act = sum((t.shape[0] + t.rows) * ACTIVATION_BYTES * batch for t in census.tensors
              if read_kind(t.role) in ("table", "experts"))
    roles["activations"] = _line("activations", act, 0, "peak_fp32", fp32, bw)
    return Bound(target=target.name, bandwidth_bytes_per_s=bw, bandwidth_fact=bw_name, context=context,
                 batch=batch, kv_bytes_per_element=kv_bytes_per_element, roles=list(roles.values()),
                 tensors=tensors, notes=notes)
