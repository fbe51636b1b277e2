"""The search for a family judged on the whole token (the repacked layout, split attention, the gemv
geometry of the layout's generated kernel): which of its settings should a model run?

BubbleBeam's part: the family's settings from data/spaces.toml that its rules, written in chip facts,
allow on the target (the layout and split attention have none; a geometry's threads must fill whole
thread groups and fit the group's limits), the rest counted by the rule they break. FutureSight's
part: each setting's bytes per token, moved at the rate its kernels can reach, plus the kernels it
launches times the target's measured cost a kernel, which orders them; the budget keeps the best
predicted. The layout reads the values, scales and offsets of every
layer it takes (a factored gemv's partial sums besides; stacked layers launch one product for
several), at the fraction of the bandwidth products written its way (the compiler's tensor code, or
one generated kernel) were measured to reach on the target (data/futuresight.toml; the whole of it
where unmeasured, so two writers then tie). Split attention reads the cache in whole chunks, shared
among the kernels the compiler schedules to read it (asked on the CPU, nothing run), each predicted
under Little's law at one output a thread: a combine that reads the values in few outputs keeps
few bytes in flight, which is what staging avoids. A gemv geometry reads the route's layout planes,
each product under Little's law at the geometry's threads and the loads each keeps in flight.

BoltBeam's part: each kept setting runs the whole token in a fresh process, on a route (`on`) or on
tinygrad's own, with its heuristics or its BEAM search as the baseline ran,
the judge holds it against the baseline (greedy tokens, the intended route, faster beyond noise),
and every verdict, refuted ones included, goes in the ledger with its reason; a setting the ledger
refuted in the same scope is not run again until its reopen condition holds.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from statistics import median
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.judge.judge import Checks, judge
from boltbeam.measure import trace as tracefile
from boltbeam.measure.route import (CONSTANTS_LABEL, FUSION_LABEL, GEMV_LABEL, LAYOUT_LABEL, REPLAY_LABEL,
                                    SPLIT_ATTENTION_LABEL, Route, engine, routed_label)
from boltbeam.measure.tinygrad_run import kv_positions, profile_elsewhere
from boltbeam.read.roles import NORM_READERS, norm_kind
from boltbeam.route import attention, constants, fusion, gemv, replay
from boltbeam.route.fusion import Fusion
from boltbeam.route.gemv import Geometry
from boltbeam.route.layout import FAMILY, FORMS, SCALE_BYTES, STACKS, Planes, Setting, stacks, values_of
from boltbeam.search import alone as alone_timing
from boltbeam.search.alone import PER_KERNEL_FACT, geometry_sight, taken_by_layout, taken_groups
from boltbeam.search.future import LOAD_BYTES, Calibration, Work, calibration, predict
from boltbeam.search.space import families, on_target

PARTIAL_BYTES = 4     # a factored gemv's partial sum per row and group, fp32, written then read
KV_BYTES = 2          # a cached key or value element, as the bound counts it (float16)
# How each form's products are written (future.WRITERS): the compiler's tensor code, or one kernel
# generated at tinygrad's UOp level.
WRITTEN_BY = {"expanded": "tensor_code", "factored": "tensor_code", "kernel": "generated_kernel"}


@dataclass(frozen=True)
class WholeToken:
    """A generated family whose settings are judged on the whole token: what the search needs of it."""
    name: str                                   # its table in spaces.toml
    label: str                                  # what it adds to a trace's route label
    route_key: str                              # the Route field that keeps a setting
    setting: Callable[[dict[str, int]], Any]    # one setting from its parameters' values in spaces.toml
    predicted: Callable[..., "Foreseen"]        # FutureSight: (census, setting, context, target, calibration, route on)
    flags: Callable[[Any], list[str]]           # the profile flags that build a setting
    stored: Callable[[Any], Any]                # a setting as the route file keeps it
    refuses: Callable[[Route | None], str | None] = lambda on: None   # why a route cannot take the family
    admits: Callable[[dict[str, int]], bool] = lambda values: True   # whether spaces.toml's values make a setting
    unfit: Callable[[Any, Any], str | None] = lambda census, setting: None   # why the model's shape cannot take it

    def space(self, target: Target) -> tuple[list, Counter]:
        """BubbleBeam: every setting whose rules hold in the target's facts, and the rest counted by the
        rule each breaks; values that make no setting (a fusion with every knob off is the route itself; the
        generated attention kernel takes no tensor-code knob) are not candidates."""
        legal, rejected = on_target(families()[self.name], target)
        return [self.setting(s) for s in legal if self.admits(s)], rejected


@dataclass(frozen=True)
class Foreseen:
    """FutureSight's view of one setting: bytes a token reads, kernels it launches, and the time to move
    those bytes at the rate its kernels can reach (terms: what limited that rate; fraction: the measured
    fraction of the bandwidth it was moved at, 1 where none applies)."""
    bytes: int
    kernels: int
    memory_us: float
    terms: tuple[str, ...]
    fraction: float = 1.0

    def us(self, target: Target) -> float:
        """The prediction: moving the bytes, plus the target's measured cost of each kernel."""
        return self.memory_us + self.kernels * (target.fact(PER_KERNEL_FACT) or 0.0) * 1e6


@dataclass
class Candidate:
    setting: Any
    predicted_bytes: int
    predicted_kernels: int
    predicted_us: float
    predicted_terms: tuple[str, ...] = ()
    predicted_fraction: float = 1.0
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    median_us: float | None = None
    skipped: str | None = None     # why it did not run: the ledger or the budget
    trace: str | None = None       # its whole-token profile
    ledger_id: int | None = None   # the ledger entry of its verdict
    recalled: bool = False         # its verdict read from the ledger (recall), not timed again

    @property
    def flag(self) -> str:
        return self.setting.flag


@dataclass
class Choice:
    family: str
    baseline_median_us: float | None     # None: no setting ran or was recalled, so the baseline was not needed
    candidates: list[Candidate]
    chosen: Candidate | None
    rejected: dict[str, int] = field(default_factory=dict)    # settings a rule in chip facts (BubbleBeam) or the model rejects, by rule
    alone: list[alone_timing.Product] = field(default_factory=list)   # gemv: each product's geometries timed alone

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "baseline_median_us": self.baseline_median_us,
                "chosen": self.chosen.flag if self.chosen else None,
                "chosen_trace": self.chosen.trace if self.chosen else None, "rejected_by_reason": self.rejected,
                "candidates": [{**asdict(c), "setting": c.flag} for c in self.candidates],
                **({"alone": [asdict(p) for p in self.alone]} if self.alone else {})}


def layout_setting(values: dict[str, int]) -> Setting:
    """A layout setting from its parameters' values (scale bytes, the form's and the stack's places)."""
    by_bytes = {b: d for d, b in SCALE_BYTES.items()}
    return Setting(by_bytes[values["scale_bytes"]], FORMS[values["form"]], STACKS[values["stacked"]])


def predicted_bytes(census, setting: Setting) -> int:
    """Bytes one token reads with the layout: each layer it takes as planes (an offset plane counted
    for every group: at most), every other tensor as the census has it."""
    total = 0
    for t in census.tensors:
        if not taken_by_layout(t):
            total += 0 if t.tied else t.bytes_per_token
            continue
        v = values_of(t.format)
        cols, rows = t.shape
        groups = rows * cols // v.group
        total += rows * cols * v.bits // 8 + groups * 2 * SCALE_BYTES[setting.scale_dtype]
        if setting.form == "factored":
            total += 2 * groups * PARTIAL_BYTES
    return total


def predicted_products(census, setting: Setting) -> int:
    """Kernels one token launches for the layers the layout takes: one a layer, or a stack when the
    stack is on; a factored product needs two."""
    return len(taken_groups(census, setting)) * (2 if setting.form == "factored" else 1)


def layout_prediction(census, setting: Setting, context: int, target: Target, cal: Calibration,
                      on: Route | None = None) -> Foreseen:
    """The planes' bytes at the fraction of the bandwidth products written as this form's are measured
    to reach on the target (the whole bandwidth where that is unmeasured)."""
    nbytes, writer = predicted_bytes(census, setting), WRITTEN_BY[setting.form]
    fraction = cal.fraction(writer)
    return Foreseen(nbytes, predicted_products(census, setting), nbytes / (target.bandwidth * fraction) * 1e6,
                    ("bandwidth",) if fraction == 1.0 else ("bandwidth", f"measured {writer}"), fraction)


def split_prediction(census, split: attention.Split, context: int, target: Target, cal: Calibration,
                     on: Route | None = None) -> Foreseen:
    """The cache a decode token at `context` reads by whole chunks, shared evenly among the kernels the
    compiler schedules to read it, each predicted by FutureSight at one output a thread (Little's law:
    a combine that reduces over every position in few outputs keeps few bytes in flight)."""
    f = census.facts
    # Tensor code reads whole chunks; the generated kernel's loads stop at the position.
    positions = context + 1 if split.kernel else -(-(context + 1) // split.chunk) * split.chunk
    nbytes = f.blocks * positions * f.kv_heads * (f.head_dim + f.value_dim) * KV_BYTES
    cache = kv_positions(census, context + 1)
    kernels = attention.scheduled(split, f.heads, f.kv_heads, f.head_dim, cache, context)
    readers = [k for k in kernels if k.reads_cache]
    per_reader = nbytes // f.blocks // max(1, len(readers))
    # A thread an output, in groups of the chip's thread-group width, as the compiler's heuristics place them;
    # the generated kernel's groups are a chunk's positions times the query heads a key head serves (fewer
    # groups than multiprocessors leave some idle: FutureSight's share term).
    width = split.threads(f.heads // max(1, f.kv_heads), f.head_dim) if split.kernel else target.fact("thread_group_width")
    grouped = {"local": int(width or 1)}
    if split.kernel:    # as many loads in flight a thread as calibrated at LOAD_BYTES each, but of the kernel's width;
        # unrolled, a thread's whole key row at once; lanes, its run of a key row (chunk keys), written out
        load = KV_BYTES * (attention.WIDE_KEYS if split.wide else 1)
        in_flight = (f.head_dim * KV_BYTES if split.unrolled else split.chunk * KV_BYTES if split.lanes
                     else cal.bytes_in_flight_per_thread * load // LOAD_BYTES)
        cal = dataclasses.replace(cal, bytes_in_flight_per_thread=max(1, in_flight))
    sights = [predict(Work(per_reader, 0, k.outputs), grouped, target, cal) for k in readers]
    terms = tuple(dict.fromkeys(t for p in sights for t in p.terms))
    removed = rotary_kernels_removed(census, on) if split.rotary else 0
    return Foreseen(nbytes, f.blocks * len(kernels) - removed, f.blocks * sum(p.us for p in sights),
                    terms + (("kernels removed",) if removed > 0 else ()))


def rotary_kernels_removed(census, on: Route | None) -> int:
    """The kernels split attention's rotary kernel takes from a token, net, a block at a time: tinygrad's
    turned query and turned key (the key's with the cache store), their means of squares where the block
    norms them, and the copy of the product their rows are taken from where the route's layout stacks the
    query and key in one product; one rotary kernel in their place."""
    groups = taken_groups(census, Setting(**on.layout)) if on and on.layout else []
    removed = 0
    for block in sorted({t.block for t in census.tensors if t.role == "attn_q" and t.block is not None}):
        normed = any(t.block == block and t.role == "attn_q_norm" for t in census.tensors)
        copied = any({"attn_q", "attn_k"} <= {t.role for t in g if t.block == block} for g in groups)
        removed += 2 + 2 * normed + copied - 1
    return removed


def layout_products(census, setting: Setting) -> list[Planes]:
    """The products one token runs with the layout, as planes without tensors (their shapes and bits):
    one a layer, or one a stack when the stack is on."""
    products = []
    for group in taken_groups(census, setting):
        v = values_of(group[0].format)
        products.append(Planes(sum(t.shape[1] for t in group), group[0].shape[0], v.bits, v.group,
                               None, None, None, None))
    return products


def kernel_layout_needed(family: str) -> Callable[[Route | None], str | None]:
    """Why a route cannot take a family that builds on the layout's generated kernel (None: it can)."""
    def why(on: Route | None) -> str | None:
        if on is None or not on.layout or on.layout.get("form") != "kernel":
            return (f"the {family} family builds on the layout's generated kernel: search it --on a route whose "
                    f"layout form is kernel")
        return None
    return why


def gemv_prediction(census, geometry: Geometry, context: int, target: Target, cal: Calibration,
                    on: Route | None = None) -> Foreseen:
    """Each product of the route's layout at the geometry (geometry_sight); a product the geometry does
    not divide at the fraction of the bandwidth the compiler's choices for generated kernels were
    measured to reach."""
    if why := kernel_layout_needed(gemv.SPACE)(on):
        raise BadInput(why)
    setting = Setting(**on.layout)
    fraction = cal.fraction(WRITTEN_BY["kernel"])
    nbytes, us, terms = 0, 0.0, ["bandwidth"]
    for p in layout_products(census, setting):
        groups = p.rows * p.cols // p.group
        b = p.rows * p.cols * p.bits // 8 + groups * 2 * SCALE_BYTES[setting.scale_dtype]
        nbytes += b
        if (sight := geometry_sight(p, b, geometry, target, cal)) is None:
            us += b / (target.bandwidth * fraction) * 1e6
            terms.append(f"measured {WRITTEN_BY['kernel']}")
            continue
        us += sight.us
        terms += sight.terms
    return Foreseen(nbytes, 0, us, tuple(dict.fromkeys(terms)))


# Kernels one generated norm adds to a token, net: on the H200 route (bench/h200/kernels/) 73 norms took 145
# of tinygrad's kernels away and brought 290 (the norms, 73 casts of their output, 144 residual sums).
RMS_KERNELS_ADDED = 2


def fusion_prediction(census, folded: Fusion, context: int, target: Target, cal: Calibration,
                      on: Route | None = None) -> Foreseen:
    """The norms folded into the route's layout products: each product that folds one reads the norm's
    weight (float32) beside its planes, and the norms launch no kernel of their own (a norm with a reader
    the layout does not take stays, and costs what it cost without the family). Its kernels are those it
    removes, counted negative: a fused feed-forward one a block whose gate and up the layout takes (the
    activation alone), and the stack's copy where they are stacked; the folded norms' are not counted (the
    input's copy replaces them). A generated norm adds RMS_KERNELS_ADDED: tinygrad's two kernels go, but a
    custom kernel's input and output are buffers of their own, so the elementwise work tinygrad fused into
    the norm's kernels and its readers (the residual sum it reads, the cast of its float32 output) runs as
    kernels beside it. Read in place, the attention's output loses its copy where the route runs split
    attention's generated kernels (one kernel a block whose output projection the layout takes)."""
    if why := kernel_layout_needed(fusion.SPACE)(on):
        raise BadInput(why)
    stack = Setting(**on.layout).stack == "stacked"
    nbytes = removed = 0
    for t in census.tensors:
        if (kind := norm_kind(t.name, t.block)) is None:
            continue
        readers = [r for r in census.tensors if r.block == t.block and r.role in NORM_READERS[kind]]
        if folded.norm and readers and all(taken_by_layout(r) for r in readers):
            nbytes += len(stacks(readers) if stack else readers) * t.elements * 4
        elif folded.rms:
            removed -= RMS_KERNELS_ADDED
    if folded.gated:
        gates = {(t.block, t.role) for t in census.tensors if t.role in ("ffn_gate", "ffn_up") and taken_by_layout(t)}
        removed += (2 if stack else 1) * sum((b, "ffn_up") in gates for b, role in gates if role == "ffn_gate")
    if folded.inplace and (on.split_attention or {}).get("kernel"):     # the attention's output, copied no more
        removed += sum(t.role == "attn_output" and taken_by_layout(t) for t in census.tensors)
    return Foreseen(nbytes, -removed, nbytes / target.bandwidth * 1e6,
                    ("bandwidth",) + (("kernels removed",) if removed > 0 else ("kernels added",) if removed else ()))


def constants_prediction(census, once: constants.Once, context: int, target: Target, cal: Calibration,
                         on: Route | None = None) -> Foreseen:
    """Tensors that read nothing, computed once at load: a token then moves none of their bytes and launches
    none of their kernels."""
    return Foreseen(0, 0, 0.0, ("computed once at load",))


def replay_prediction(census, direct: replay.Direct, context: int, target: Target, cal: Calibration,
                      on: Route | None = None) -> Foreseen:
    """The host's step before the first kernel, shortened: the device moves the same bytes in the same kernels."""
    return Foreseen(0, 0, 0.0, ("host time only",))


def measured_fraction(path: str, target: Target) -> tuple[str, float]:
    """How the products of the layout profiled at `path` were written, and the fraction of the target's
    bandwidth they reached: the planes' bytes (each read once a token) over the per-token median of
    the weight regions' kernel time."""
    from boltbeam.account.compare import region_times
    from boltbeam.read.roles import REGIONS
    trace = tracefile.load(path)
    layout = trace.route.get("settings", {}).get("families", {}).get(LAYOUT_LABEL)
    if not layout or layout.get("form") not in WRITTEN_BY or not layout.get("bytes"):
        raise BadInput(f"trace {path}: ran no layout whose form and bytes it records")
    times = region_times(trace)
    us = sum(times[r] for r in REGIONS if r != "norms")
    if not us > 0:
        raise BadInput(f"trace {path}: no kernel time on a weight's role")
    return WRITTEN_BY[layout["form"]], layout["bytes"] / (us * 1e-6) / target.bandwidth


LAYOUT = WholeToken(FAMILY, LAYOUT_LABEL, "layout", layout_setting, layout_prediction,
                    lambda s: ["--layout", s.flag], asdict)
SPLIT = WholeToken(attention.SPACE, SPLIT_ATTENTION_LABEL, "split_attention",
                   lambda v: attention.Split(v["chunk"], **{k: bool(v[k]) for k in attention.KNOBS}), split_prediction,
                   lambda s: ["--split-attention", s.flag], asdict, admits=attention.Split.admits,
                   unfit=lambda census, s: s.unfit(census.facts.head_dim) if s.kernel else None)
GEMV = WholeToken(gemv.SPACE, GEMV_LABEL, "gemv", lambda v: Geometry(**v), gemv_prediction,
                  lambda s: ["--gemv", s.flag], lambda s: s.stored(), kernel_layout_needed(gemv.SPACE))
FUSION = WholeToken(fusion.SPACE, FUSION_LABEL, "fusion", lambda v: Fusion(**v), fusion_prediction,
                    lambda s: ["--fusion", s.flag], asdict, kernel_layout_needed(fusion.SPACE), lambda v: any(v.values()))
CONSTANTS = WholeToken(constants.SPACE, CONSTANTS_LABEL, "constants_once", lambda v: constants.Once(**v),
                       constants_prediction, lambda s: ["--constants-once"], lambda s: True)
REPLAY = WholeToken(replay.SPACE, REPLAY_LABEL, "direct_replay", lambda v: replay.Direct(**v), replay_prediction,
                    lambda s: ["--direct-replay"], lambda s: True)
WHOLE_TOKEN = {f.name: f for f in (LAYOUT, SPLIT, GEMV, FUSION, CONSTANTS, REPLAY)}


def with_setting(family: WholeToken, on: Route | None, setting, sha: str, device: str, target: str,
                 beam: int) -> Route:
    """The route that runs `on` (or tinygrad's own) with the family at this setting, at BEAM width `beam`."""
    if on is None:
        on = Route(sha, engine(), device, target, family.name, "generated by search", [])
    return dataclasses.replace(on, beam=beam, **{family.route_key: family.stored(setting)})


def label_of(on: Route | None, beam: int, families: list[str] | None = None) -> str:
    """The route label of a run on the route `on` (its families, unless `families` names others) or on
    tinygrad's own scheduler or BEAM."""
    rest = "boltbeam-search" if on else f"tinygrad-beam-{beam}" if beam else "tinygrad-scheduler"
    return routed_label(families if families is not None else on.families() if on else [], rest)


def baseline_of(path: str, sha: str, device: str, context: int, beam: int, on: Route | None = None):
    """A baseline trace profiled earlier: this model and device at this depth and BEAM width, on the
    route `on` (or tinygrad's own), or one clear line on what differs."""
    base = tracefile.load(path)
    route, env, work = base.route, base.environment, base.workload
    label = label_of(on, beam)
    problems = [what for what, bad in (
        ("another model", env.get("model_sha256") not in (None, sha)),
        (f"device {env.get('device')}", env.get("device") != device),
        (f"context {work.get('context')}", work.get("context") != context),
        (f"BEAM width {route.get('settings', {}).get('beam', 0)}", route.get("settings", {}).get("beam", 0) != beam),
        (f"route {route.get('label')!r}", route.get("label") != label),
    ) if bad]
    if problems:
        raise BadInput(f"baseline {path}: ran {', '.join(problems)}; the search needs route {label!r} of this model "
                       f"on {device} at context {context}" + (f" with --beam {beam}" if beam else ""))
    return base


def legal_space(family: WholeToken, target: Target) -> tuple[list, Counter]:
    """The family's legal settings on the target and the rejected by reason, or one line on why none is legal."""
    legal, rejected = family.space(target)
    if not legal:
        raise BadInput(f"target {target.name}: no setting of {family.name} is legal there (" + "; ".join(
            f"{n} rejected: {why}" for why, n in rejected.most_common()) + ")")
    return legal, rejected


def check_on(family: WholeToken, path: str, on: Route | None, target: Target) -> None:
    """A route the family's settings can go on (None: tinygrad's own): one the family can build on, on a
    target where a setting is legal. A route that sets the family already is searched again, where the
    family has another setting: each candidate replaces its setting, and the route as it is is the baseline."""
    if why := family.refuses(on):
        raise BadInput(why)
    legal, _ = legal_space(family, target)
    current = getattr(on, family.route_key) if on else None
    if current and all(_same_setting(family.stored(s), current) for s in legal):
        raise BadInput(f"route {path} already sets {family.route_key} to the family's only setting here: nothing "
                       f"to search")


def _knobs_changed(stored, current) -> int:
    """How many knobs of a setting (as a route stores it) differ from the route's own setting of the family
    (a route without it: each knob that is on; a knob the route file predates reads as off)."""
    if not isinstance(stored, dict):
        return int(stored != current)
    current = current if isinstance(current, dict) else {}
    return sum(stored.get(k, 0) != current.get(k, 0) for k in stored.keys() | current.keys())


def _same_setting(stored, current) -> bool:
    """Whether a candidate (as a route stores it) is the route's own setting."""
    return current is not None and _knobs_changed(stored, current) == 0


def per_product(census, route_on: Route, legal: list, target: Target, cal: Calibration, most: int, seconds: float,
                say: Callable[[str], None], earlier: dict | None = None) -> tuple[Candidate | None, list]:
    """gemv: each product of the route's layout timed alone at its `most` best predicted geometries
    (search/alone.py; an earlier search's fastest first where `earlier` holds them), and the setting that
    gives each product its fastest, as a candidate whose prediction is those times, each as often as a
    token runs its product (None: no product timed)."""
    products = alone_timing.time_products(census, Setting(**route_on.layout), legal, target, cal, most, seconds, say,
                                          earlier)
    chosen = [p for p in products if p.best is not None]
    if not chosen:
        return None, products
    setting = gemv.PerProduct(tuple((p.key, Geometry.parse(p.best)) for p in chosen))
    return Candidate(setting, sum(p.count * p.bytes for p in chosen), 0, sum(p.count * p.best_us for p in chosen),
                     ("timed alone",)), products


def route_settings(on: Route | None) -> dict[str, Any] | None:
    """What a route sets of each whole-token family (None: tinygrad's own), as the ledger's scope keeps it."""
    return {f.route_key: getattr(on, f.route_key) for f in WHOLE_TOKEN.values()} | {"beam": on.beam} if on else None


def recalled(ledger, candidate_id: str, key: dict[str, Any]):
    """The newest verdict the ledger holds on this candidate in exactly this scope (the route it went on, the
    depth, the tokens, the engine...), or None."""
    from boltbeam.ledger.store import canonical
    return next((e for e in reversed(ledger.entries(candidate=candidate_id))
                 if all(canonical(e.scope.get(k)) == canonical(v) for k, v in key.items())), None)


def choose(family: WholeToken, model: str, census, device: str, context: int, tokens: int, target: Target, ledger,
           sha: str, out: Path, say: Callable[[str], None] = lambda s: None, beam: int = 0, budget: int | None = None,
           baseline: tuple[str, Any] | None = None, on: tuple[str, Route] | None = None,
           alone: int | None = None, seconds: float = 30.0, earlier: dict | None = None, recall: bool = False,
           deadline: float | None = None, ran: Callable[[], None] = lambda: None) -> Choice:
    """Judge the family's `budget` best predicted settings on the whole token, added to the route `on`
    (path, route, passed by check_on; replacing its own setting of the family, if any) or to tinygrad's own,
    against that route as it is (BEAM width `beam` on both
    sides; profiled here unless `baseline` is (path, trace) of it, from baseline_of); the fastest
    promoted one wins. gemv with `alone`: first each product's geometries are timed alone (per_product,
    at most `alone` a product and `seconds` of its own, an earlier search's fastest first where `earlier`,
    from alone.earlier_times, holds them), and the geometry for each product is judged first.
    With `recall`, a setting the ledger judged in exactly this scope keeps that verdict and is not timed
    again, and the baseline is profiled only when a setting runs. No setting starts after `deadline`
    (time.monotonic()); `ran` is called after each profile."""
    path_on, route_on = on if on else ("none", None)
    cal = calibration(target.name)
    legal, rejected = legal_space(family, target)
    candidates = []     # FutureSight first: on the CPU, before any token runs
    for s in legal:
        if why := family.unfit(census, s):      # the model's shape, not the chip, rules it out: counted as rejected
            rejected[f"the model: {why}"] += 1
            continue
        sight = family.predicted(census, s, context, target, cal, route_on)
        candidates.append(Candidate(s, sight.bytes, sight.kernels, sight.us(target), sight.terms,
                                    sight.fraction))
    # Equal predictions: the fewest knobs changed from the route's own setting first (the least FutureSight
    # has not seen), then the legal space's order.
    current = getattr(route_on, family.route_key) if route_on else None
    candidates.sort(key=lambda c: (c.predicted_us, _knobs_changed(family.stored(c.setting), current)))
    products = []
    if alone:
        first, products = per_product(census, route_on, legal, target, cal, alone, seconds, say, earlier)
        candidates[:0] = [first] if first else []
    flags = ["--context", str(context), "--tokens", str(tokens), "--beam", str(beam), "--route", path_on]

    def base() -> tuple[str, Any]:
        nonlocal baseline
        if baseline is None:
            say("the whole token without the family")
            path = str(out / "baseline.json")
            if failed := profile_elsewhere(model, device, path, *flags):
                raise Refused(f"profiling the baseline failed: {failed}")
            ran()
            baseline = path, baseline_of(path, sha, device, context, beam, route_on)
        return baseline
    if not recall:
        base()
    scope = {"device": device, "target": target.name, "engine": engine(), "family": family.name, "model_sha256": sha,
             "beam": beam, "context": context, "tokens": tokens, "on": label_of(route_on, beam),
             "route": route_settings(route_on)}
    base_us = median(baseline[1].token_wall_us) if baseline else None
    tried = 0
    for c in candidates:
        candidate_id = f"{family.name} {c.flag}"
        if current and not isinstance(c.setting, gemv.PerProduct) and _same_setting(family.stored(c.setting), current):
            c.skipped = "the route's own setting: the baseline"
            continue
        if recall and (e := recalled(ledger, candidate_id, {**scope, "setting": c.flag})) is not None:
            c.verdict, c.reasons, c.median_us, c.ledger_id, c.recalled = (e.verdict, e.reasons, e.scope.get("median_us"),
                                                                          e.id, True)
            c.trace = next((ev["path"] for ev in e.evidence[1:]), None)
            base_us = base_us or e.scope.get("baseline_median_us")
            tried += 1
            continue
        skip, why = ledger.should_skip(candidate_id, {**scope, "setting": c.flag})
        if skip:
            c.skipped = why
            continue
        if budget is not None and tried >= budget:
            c.skipped = f"beyond the budget: FutureSight kept the {budget} best predicted setting(s)"
            continue
        if deadline is not None and time.monotonic() >= deadline:
            c.skipped = "out of time: the time budget was spent before it started"
            continue
        tried += 1
        baseline_path, trace_base = base()
        base_us = median(trace_base.token_wall_us)
        say(f"the whole token with {family.name} {c.flag}")
        path = out / f"{family.name}_{'per_product' if isinstance(c.setting, gemv.PerProduct) else c.flag.replace(':', '_')}.json"
        c.trace = str(path)
        if failed := profile_elsewhere(model, device, str(path), *flags, *family.flags(c.setting)):
            raise Refused(f"profiling {family.name} {c.flag} failed: {failed}")
        ran()
        trace = tracefile.load(str(path))
        expected = with_setting(family, route_on, c.setting, sha, device, target.name, beam)
        j = judge(trace_base, trace, Checks(expected_route=label_of(route_on, beam, expected.families()),
                                            candidate_id=candidate_id, reopen=f"engine!={engine()}"))
        c.verdict, c.reasons = j.verdict, j.reasons
        c.median_us = median(trace.token_wall_us)
        c.ledger_id = ledger.append(candidate=candidate_id, verdict=j.verdict, reasons=j.reasons, scope={
            **j.scope, **scope, "setting": c.flag, "predicted_us": c.predicted_us, "median_us": c.median_us,
            "baseline_median_us": base_us}, evidence=[baseline_path, str(path)], reopen=j.reopen,
            actor="boltbeam search")
    promoted = [c for c in candidates if c.verdict == "promote"]
    chosen = min(promoted, key=lambda c: c.median_us) if promoted else None
    return Choice(family.name, base_us, candidates, chosen, dict(rejected), products)
