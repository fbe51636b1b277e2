"""BoltBeam's one normalized trace: what every adapter and importer writes, and what account,
compare and judge read. Versioned JSON; `load` validates and raises BadInput with one line.

Layout (version 1)::

  format: "boltbeam-trace", version: 1
  environment: engine, engine_version, device, driver, compiler, compiler_version, host,
               python, command, model_path, model_sha256, and where known more (Environment)
  workload:    context (KV depth), tokens (measured), warmup, batch
  route:       label (provenance of what executed), switch (how to turn it off), settings {}
  token_wall_us:        every plain token's wall time, as users run the route (nothing recording), µs
  output_tokens:        the tokens the route produced (for correctness checks), or null
  memory:      peak_bytes, capacity_bytes (either may be null)
  kernel_pass_wall_us:  wall time of each timed token (the kernel pass), µs (may be empty)
  kernel_pass: timing (a key of TIMINGS: how the kernels were timed), per measured token the JIT
               calls and graph launches the host made (what launch and sync cost is counted on),
               host marks and brackets, and the tokens timed per launch beside them (CUDA),
               or null (older traces, importers)
  kernels:     one event per kernel of the timed tokens: token, index, name,
               start_us (from the token's first kernel, one device timeline) or null,
               duration_us, role (weight role or null), category, tensors, bytes, flops,
               global_size, local_size, opts
  provenance:  source ("profile" or "import:KIND"), tool_version, created, inputs, notes

environment, workload, route, provenance and memory are read as the dataclasses of RECORDS, each key
a field: a key no field names is refused, as a kernel's is. Every field may be null, or absent (the
two read the same); one that only some writers write is written only where set, so a trace saved again
keeps the keys it had.
"""
from __future__ import annotations

from dataclasses import asdict, astuple, dataclass, field, fields
from typing import Any, Callable

from boltbeam.errors import BadInput
from boltbeam.files import load_json, write_json
from boltbeam.units import is_number, is_whole

FORMAT = "boltbeam-trace"
PAIR_TRIM = 0.25   # pairs an account leaves out at each end of the plain-minus-timed differences
VERSION = 1

# What a kernel that moves no weight does; "weights" marks one that reads a weight table,
# "constant" one that reads no buffer at all (it writes the same bytes every token).
CATEGORIES = ("weights", "attention", "norm", "rope", "kv_write", "constant", "copy", "elementwise",
              "sampling", "other")

# How a kernel pass timed its kernels. In-graph timings time the replay users run; the others
# time a different execution of the same kernels, and the account says so.
TIMINGS = {
    "cupti": "in the graph replay: CUPTI activity records of every kernel of tinygrad's CUDA graphs, "
             "flushed once after the measured tokens",
    "hcq": "in the graph replay: tinygrad's own timestamps before and after every kernel of its command-queue "
           "graphs (a graph built with PROFILE=1), measured tokens interleaved with plain ones",
    "launch": "one by one, outside the graph (no in-graph timing here): JIT=2, CUDA events around each launch, "
              "one synchronize per token",
    "import": "the source profiler's own records",
}
IN_GRAPH = ("cupti", "hcq")


def _where_set() -> Any:
    """A field only some writers write: to_dict leaves it out while it is null."""
    return field(default=None, metadata={"where_set": True})


@dataclass
class Environment:
    """Where the tokens ran, in the order tinygrad's adapter writes it."""
    engine: str | None = None
    engine_version: str | None = None
    device: str | None = None                  # as the engine names it: CUDA, CPU, ...
    host: str | None = None
    python: str | None = None
    platform: str | None = _where_set()
    compiler: str | None = None
    renderer: str | None = _where_set()
    command: str | None = None
    model_path: str | None = None
    model_sha256: str | None = None
    tool: str | None = _where_set()            # "boltbeam VERSION" where BoltBeam ran the engine
    device_name: str | None = _where_set()     # the driver's name of the chip (a target's device_name)
    driver: str | None = None
    arch: str | None = _where_set()
    compiler_version: str | None = None


@dataclass
class Workload:
    context: int | None = None                 # KV depth
    tokens: int | None = None                  # plain tokens measured
    warmup: int | None = None
    batch: int | None = None
    kernel_pass_depths: list[int] | None = _where_set()   # the KV depth of each timed token
    prompt: str | None = _where_set()          # the function that made the prompt ids


@dataclass
class RouteRecord:
    """What executed: `label` says what (its provenance), `switch` how to turn it off. `settings` stays a
    free dict: the route file's and each family's own settings, which each family writes its own way."""
    label: str | None = None
    switch: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reference:
    """Another engine's greedy tokens on the trace's prompt ids (audit --reference)."""
    engine: str
    output_tokens: list[int]


@dataclass
class Phases:
    """Where a profile's own seconds went, in the order they ran (BoltBeam's profile only): opening the device and
    the timing, loading the model, building the route's families on it, the prompt's prefill, the warm-up tokens
    (compiling the decode), and the measured tokens."""
    setup_s: float
    load_s: float
    families_s: float
    prefill_s: float
    warmup_s: float
    tokens_s: float


@dataclass
class Provenance:
    source: str | None = None                  # "profile" or "import:KIND"
    tool_version: str | None = None
    created: str | None = None
    timing: str | None = _where_set()          # how the kernels were timed, in words
    notes: list[str] | None = _where_set()
    inputs: list[dict[str, Any]] = field(default_factory=list)   # each file read: {path, sha256}
    record: dict[str, Any] | None = _where_set()          # llama-bench: the test's own fields
    kernels_outside_tokens: int | None = _where_set()     # chrome trace: kernels no token's span holds
    reference: Reference | None = _where_set()
    phases: Phases | None = _where_set()


@dataclass
class Memory:
    peak_bytes: int | None = None
    capacity_bytes: int | None = None


RECORDS = {"environment": Environment, "workload": Workload, "route": RouteRecord, "provenance": Provenance,
           "memory": Memory}


@dataclass
class KernelPass:
    """How the kernels of the measured tokens were timed, and what the host launched per token."""
    timing: str
    jit_calls: list[int]          # JIT replays the host ran, per measured token
    graph_launches: list[int]     # graphs those replays launched, per measured token
    # Checks, never lines: per measured token, host mark to first kernel start and last kernel end to
    # host mark, on the timing's own clock (null where host and device clocks differ)
    lead_us: list[float] | None = None
    trail_us: list[float] | None = None
    # Brackets (CUDA events, or the device's own stamps) before each token's first kernel launch and
    # after its last, per plain token and per measured token: what the timing itself adds to the
    # device time, measured apart from it
    plain_bracket_us: list[float] | None = None
    timed_bracket_us: list[float] | None = None
    # Per plain token and per measured token: the host's time from the token's start to its first kernel
    # launch (tinygrad's JIT replay in Python), on the host (the timing's clock for measured tokens)
    plain_host_us: list[float] | None = None
    timed_host_us: list[float] | None = None
    # Tokens timed per launch, not per kernel (CUDA: CUPTI's graph records, its per-kernel activity off),
    # interleaved with the measured ones, one beside each: per such token its wall, its launches' device span,
    # and on the timing's clock its start to its first launch call (null where not seen), to its first
    # launch's device start, and its last launch's device end to its return
    launch_wall_us: list[float] | None = None
    launch_span_us: list[float] | None = None
    launch_host_us: list[float] | None = None
    launch_lead_us: list[float] | None = None
    launch_trail_us: list[float] | None = None

    @property
    def in_graph(self) -> bool:
        return self.timing in IN_GRAPH


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
    reads_buffers: int | None = None   # input buffers it reads (0: it computes a constant)
    writes_bytes: int | None = None    # bytes of the buffers it writes
    launch: int | None = None          # the host launch it ran in (a graph, or one kernel), numbered in its token


@dataclass
class Trace:
    environment: Environment
    workload: Workload
    route: RouteRecord
    token_wall_us: list[float]
    provenance: Provenance
    output_tokens: list[int] | None = None
    memory: Memory = field(default_factory=Memory)
    kernel_pass_wall_us: list[float] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    kernel_pass: KernelPass | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in RECORDS:
            unset = {f.name for f in fields(getattr(self, name)) if f.metadata.get("where_set")}
            d[name] = {k: v for k, v in d[name].items() if v is not None or k not in unset}
        return {"format": FORMAT, "version": VERSION, **d}

    def kept_pairs(self, trim: float = PAIR_TRIM) -> list[int] | None:
        """The timed tokens an account averages over: each paired with the plain token of its index (run
        beside it where the timing interleaves them), the `trim` of pairs whose plain wall less the wall
        beside it is lowest and the `trim` where it is highest left out (a machine that changed speed within
        a pair). Beside it: the token timed per launch, where the trace has them; else the timed token less
        what its timing added, where measured (brackets): what the timing costs is no change of speed. None when the trace cannot pair them (no timed wall per timed token, or too few plain ones)."""
        tokens = sorted({k.token for k in self.kernels})
        if tokens != list(range(len(tokens))) or not len(self.kernel_pass_wall_us) == len(tokens) <= len(self.token_wall_us):
            return None
        kp = self.kernel_pass
        if kp and kp.launch_wall_us and len(kp.launch_wall_us) == len(tokens):   # the token timed per launch beside it
            beside = kp.launch_wall_us
        else:   # the timed token, less what its timing added where that was measured
            cost = self.timing_cost_us() or [0.0] * len(tokens)
            beside = [w - c for w, c in zip(self.kernel_pass_wall_us, cost)]
        order = sorted(tokens, key=lambda i: self.token_wall_us[i] - beside[i])
        drop = int(trim * len(order))
        return sorted(order[drop:len(order) - drop])

    def timing_cost_us(self) -> list[float] | None:
        """Per timed token, the device time its per-kernel timing added: its kernels' span less the span of
        the token timed per launch beside it, or else its bracket less the plain token's of the same index
        (None with neither)."""
        kp = self.kernel_pass
        if kp and kp.launch_span_us and len(kp.launch_span_us) == len(groups := self.by_token()):
            spans = [timeline(ks) for ks in groups.values()]
            if all(spans):
                return [t.span_us - s for t, s in zip(spans, kp.launch_span_us)]
        if kp is None or not kp.plain_bracket_us or not kp.timed_bracket_us:
            return None
        return [t - p for p, t in zip(kp.plain_bracket_us, kp.timed_bracket_us)]

    def by_token(self) -> dict[int, list[Kernel]]:
        """Each measured token's kernels in launch order (index), tokens in order."""
        groups: dict[int, list[Kernel]] = {}
        for k in self.kernels:
            groups.setdefault(k.token, []).append(k)
        return {t: sorted(groups[t], key=lambda k: k.index) for t in sorted(groups)}

    def kernels_of_token(self, token: int) -> list[Kernel]:
        return self.by_token().get(token, [])

    @property
    def kernel_tokens(self) -> list[int]:
        return sorted({k.token for k in self.kernels})


@dataclass(frozen=True)
class Timeline:
    """One token's kernels on their device timeline, in start order."""
    gaps_us: float          # idle time between consecutive kernels
    overlap_us: float       # time kernels ran at the same time
    span_us: float          # first start to the last end: kernels + gaps - overlap
    biggest_gap_us: float
    # of gaps_us, the idle time before a kernel of another host launch than the kernel before it (the
    # device waiting on the host's next graph), the rest (before a kernel of the same launch), and how many
    # such boundaries; None where a kernel's launch is not known
    between_launches_us: float | None = None
    within_launches_us: float | None = None
    launch_boundaries: int | None = None


def timeline(kernels: list[Kernel]) -> Timeline | None:
    """The token's timeline, or None when a kernel has no start."""
    if not kernels or any(k.start_us is None for k in kernels):
        return None
    ks = sorted(kernels, key=lambda k: k.start_us)
    gaps = overlap = biggest = between = within = 0.0
    boundaries = 0
    covered = ks[0].start_us + ks[0].duration_us     # the device is busy until then (any kernel so far)
    for a, b in zip(ks, ks[1:]):
        d = b.start_us - covered
        gaps += max(0.0, d)
        overlap += min(b.duration_us, max(0.0, -d))    # a kernel wholly inside earlier ones overlaps by its length
        biggest = max(biggest, d)
        if a.launch != b.launch:
            between += max(0.0, d)
            boundaries += 1
        else:
            within += max(0.0, d)
        covered = max(covered, b.start_us + b.duration_us)
    known = all(k.launch is not None for k in ks)
    return Timeline(gaps, overlap, covered - ks[0].start_us, biggest, *((between, within, boundaries) if known
                                                                         else (None, None, None)))


_is_int, _is_num = is_whole, is_number   # bounded: a 400-digit integer is no count or time


# What each kernel field may hold: (check, what the error says it must be).
_KERNEL_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "token": (lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    "index": (lambda v: _is_int(v) and v >= 0, "a whole number >= 0"),
    "name": (lambda v: isinstance(v, str), "a string"),
    "duration_us": (lambda v: _is_num(v) and v >= 0, "a finite number >= 0"),
    "start_us": (lambda v: v is None or (_is_num(v) and v >= 0), "a finite number >= 0 or null"),
    "role": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "category": (lambda v: v in CATEGORIES, f"one of {', '.join(CATEGORIES)}"),
    "tensors": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "bytes": (lambda v: v is None or (_is_int(v) and v >= 0), "a byte count or null"),
    "flops": (lambda v: v is None or (_is_int(v) and v >= 0), "a whole number >= 0 or null"),
    "global_size": (lambda v: v is None or (isinstance(v, list) and all(_is_int(x) and x > 0 for x in v)),
                    "a list of positive whole numbers or null"),
    "local_size": (lambda v: v is None or (isinstance(v, list) and all(_is_int(x) and x > 0 for x in v)),
                   "a list of positive whole numbers or null"),
    "opts": (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
             "a list of strings or null"),
    "reads_buffers": (lambda v: v is None or (_is_int(v) and v >= 0), "a whole number >= 0 or null"),
    "writes_bytes": (lambda v: v is None or (_is_int(v) and v >= 0), "a byte count or null"),
    "launch": (lambda v: v is None or (_is_int(v) and v >= 0), "a whole number >= 0 or null"),
}


def _walls(d: dict, key: str, where: str) -> list[float]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(_is_num(x) and x > 0 for x in v):
        raise BadInput(f"{where}: '{key}' must be a list of token times in µs, each finite and > 0")
    return [float(x) for x in v]


def _record(cls: type, v: Any, what: str, where: str) -> Any:
    """`v` as a `cls`: an object of its fields only."""
    if not isinstance(v, dict):
        raise BadInput(f"{where}: {what} must be an object")
    try:
        return cls(**v)
    except TypeError as e:
        raise BadInput(f"{where}: {what}: {e}") from None


def _kernel(k: Any, i: int, where: str) -> Kernel:
    kern = _record(Kernel, k, f"kernel {i}", where)
    for name, (ok, must) in _KERNEL_FIELDS.items():
        if not ok(getattr(kern, name)):
            raise BadInput(f"{where}: kernel {i} ({kern.name!r}): '{name}' must be {must}, not {getattr(kern, name)!r}")
    return kern


def from_dict(d: Any, where: str = "trace") -> Trace:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise BadInput(f"{where}: not a BoltBeam trace (no \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION:
        raise BadInput(f"{where}: trace version {d.get('version')!r} is not supported (want {VERSION})")
    doc = {**d, "memory": d.get("memory") or {}}   # older traces: none
    env, workload, route, provenance, memory = (_record(cls, doc.get(key), f"'{key}'", where)
                                                for key, cls in RECORDS.items())
    for key in ("context", "batch", "tokens"):
        v = getattr(workload, key)
        if v is not None and not (_is_int(v) and v >= 0):
            raise BadInput(f"{where}: workload '{key}' must be a whole number >= 0 or null, not {v!r}")
    for key in ("model_sha256", "model_path", "engine", "device"):
        v = getattr(env, key)
        if v is not None and not isinstance(v, str):
            raise BadInput(f"{where}: environment '{key}' must be a string or null, not {v!r}")
    if route.label is not None and not isinstance(route.label, str):
        raise BadInput(f"{where}: route 'label' must be a string or null, not {route.label!r}")
    if provenance.reference is not None:
        provenance.reference = _record(Reference, provenance.reference, "provenance 'reference'", where)
    if provenance.phases is not None:
        provenance.phases = _record(Phases, provenance.phases, "provenance 'phases'", where)
        if not all(_is_num(v) and v >= 0 for v in astuple(provenance.phases)):
            raise BadInput(f"{where}: provenance 'phases' must be seconds >= 0")
    out_tokens = d.get("output_tokens")
    if out_tokens is not None and (not isinstance(out_tokens, list) or not all(_is_int(t) for t in out_tokens)):
        raise BadInput(f"{where}: 'output_tokens' must be a list of integers or null")
    for key, least in (("peak_bytes", 0), ("capacity_bytes", 1)):   # a device with no memory is no device
        v = getattr(memory, key)
        if v is not None and not (_is_int(v) and v >= least):
            raise BadInput(f"{where}: memory '{key}' must be a byte count{' > 0' if least else ''} or null, not {v!r}")
    kernels = d.get("kernels") or []
    if not isinstance(kernels, list):
        raise BadInput(f"{where}: 'kernels' must be a list")
    kernel_pass = _kernel_pass(d.get("kernel_pass"), where)
    return Trace(environment=env, workload=workload, route=route,
                 token_wall_us=_walls(d, "token_wall_us", where),
                 provenance=provenance, output_tokens=out_tokens, memory=memory,
                 kernel_pass_wall_us=_walls(d, "kernel_pass_wall_us", where),
                 kernels=[_kernel(k, i, where) for i, k in enumerate(kernels)], kernel_pass=kernel_pass)


TIMES = tuple(f.name for f in fields(KernelPass) if f.name.endswith("_us"))   # its per-token µs lists


def _kernel_pass(d: Any, where: str) -> KernelPass | None:
    if d is None:
        return None
    counts = lambda v: isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v)
    times = lambda v: v is None or (isinstance(v, list) and all(_is_num(x) for x in v))
    if (not isinstance(d, dict) or d.get("timing") not in TIMINGS
            or not {"timing", "jit_calls", "graph_launches"} <= set(d) <= {f.name for f in fields(KernelPass)}
            or not counts(d["jit_calls"]) or not counts(d["graph_launches"])
            or not all(times(d.get(k)) for k in TIMES)):
        raise BadInput(f"{where}: 'kernel_pass' must be null or {{timing: one of {', '.join(TIMINGS)}, "
                       f"jit_calls: [counts], graph_launches: [counts], {', '.join(TIMES)}: [µs] or null}}")
    return KernelPass(**d)


def load(path: str) -> Trace:
    return from_dict(load_json(path, "trace"), where=f"trace {path}")


def save(trace: Trace, path: str) -> None:
    write_json(path, trace.to_dict())
