"""The split-attention family: decode attention split over the sequence (route/attention.py builds it, its
settings are attention.Split; route/rotary.py writes its rotary kernel), declared, with FutureSight's term."""
from __future__ import annotations

import dataclasses

from boltbeam.route import attention
from boltbeam.route.attention import KNOBS, LABEL, SPACE, Split
from boltbeam.route.family import Family, Replaces, knobs
from boltbeam.route.layout import taken_groups
from boltbeam.foresight.future import LOAD_BYTES, Calibration, Foreseen, Work, predict

# A cached key or value element as tinygrad.llm holds it: its cache is made of the default float type (float32),
# twice the float16 element the bound counts (found on the H200: bench/h200/s16/); half_cache holds float16.
KV_BYTES = 4


def cache_bytes(facts, positions: int, element: int) -> int:
    """The keys and values of `positions` positions of every block's cache, at `element` bytes each."""
    return facts.blocks * positions * facts.kv_heads * (facts.head_dim + facts.value_dim) * element


def cache_element(on) -> int:
    """The bytes of a cached element on a route (`on`: its settings): KV_BYTES, unless a family holds the cache in
    another type and its setting says so (CACHE_ELEMENT_BYTES)."""
    return min((getattr(s, "CACHE_ELEMENT_BYTES", KV_BYTES) for s in (on or {}).values()), default=KV_BYTES)


def foresee(census, split: Split, context: int, target, cal: Calibration, on=None) -> Foreseen:
    """The cache a decode token at `context` reads by whole chunks, shared evenly among the kernels the
    compiler schedules to read it, each predicted by FutureSight at one output a thread (Little's law:
    a combine that reduces over every position in few outputs keeps few bytes in flight)."""
    from boltbeam.measure.tinygrad_run import kv_positions
    f = census.facts
    element = cache_element(on)
    # Tensor code reads whole chunks; the generated kernel's loads stop at the position.
    positions = context + 1 if split.kernel else -(-(context + 1) // split.chunk) * split.chunk
    nbytes = cache_bytes(f, positions, element)
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
        # burst, its runs of keys and values, all at once; unrolled, a thread's whole key row at once; lanes, its run
        # of a key row (chunk keys), written out
        load = element * (attention.WIDE_KEYS if split.wide or split.burst else 1)
        runs = attention.burst_runs(f.heads // max(1, f.kv_heads), f.head_dim, split.chunk) if split.burst else 0
        in_flight = (2 * runs * load if split.burst else f.head_dim * element if split.unrolled
                     else split.chunk * element if split.lanes else cal.bytes_in_flight_per_thread * load // LOAD_BYTES)
        cal = dataclasses.replace(cal, bytes_in_flight_per_thread=max(1, in_flight))
    sights = [predict(Work(per_reader, 0, k.outputs), grouped, target, cal) for k in readers]
    terms = tuple(dict.fromkeys(t for p in sights for t in p.terms))
    removed = rotary_kernels_removed(census, on or {}) if split.rotary else 0
    return Foreseen(nbytes, f.blocks * len(kernels) - removed, f.blocks * sum(p.us for p in sights),
                    terms + (("kernels removed",) if removed > 0 else ()))


def rotary_kernels_removed(census, on) -> int:
    """The kernels split attention's rotary kernel takes from a token, net, a block at a time: tinygrad's
    turned query and turned key (the key's with the cache store), their means of squares where the block
    norms them, and the copy of the product their rows are taken from where the layout of the route it goes
    on (`on`: its settings) stacks the query and key in one product; one rotary kernel in their place."""
    groups = taken_groups(census, on["layout"]) if "layout" in on else []
    removed = 0
    for block in sorted({t.block for t in census.tensors if t.role == "attn_q" and t.block is not None}):
        normed = any(t.block == block and t.role == "attn_q_norm" for t in census.tensors)
        copied = any({"attn_q", "attn_k"} <= {t.role for t in g if t.block == block} for g in groups)
        removed += 2 + 2 * normed + copied - 1
    return removed


FAMILY = Family(SPACE, LABEL, "split_attention", install=attention.install, read=knobs(Split, later=KNOBS[1:]),
                of_values=lambda v: Split(v["chunk"], **{k: bool(v[k]) for k in KNOBS}), foresee=foresee,
                metavar="CHUNK[:staged][:carried]|CHUNK:kernel[:wide[:unrolled]|[:unrolled]:lanes|[:unrolled]:burst]"
                        "[:rotary[:pooled]]",
                parse=Split.parse, admits=Split.admits,
                unfit=lambda census, s: s.unfit(census.facts.head_dim) if s.kernel else None,
                replaces=Replaces(regions=("attention",)),     # the cache's readers, the KV write, the rotary step
                help="decode attention split over the sequence in chunks of CHUNK positions, each read by its own "
                     "groups, then combined; `:staged` writes each chunk's partial results to buffers of their own "
                     "before the combine; `:carried` sums the exponentials as a column of ones beside the values "
                     "(two reductions fewer a layer); `:kernel` writes the split as two kernels generated at "
                     "tinygrad's UOp level (needs thread groups with local memory); `:wide` has them read a key row "
                     "eight halves a load and a run of value dimensions a thread; `:unrolled` (after :wide, or before "
                     ":lanes or :burst) writes their loops over a key row and a chunk's positions out in full (lanes: and the "
                     "combine's over the chunks, eight a step); `:lanes` (instead of :wide) "
                     "runs them a thread a query head's dimension, head size / CHUNK threads a key row; `:burst` (instead of "
                     ":wide or :lanes) has them load a chunk's keys and values first, sixteen bytes a load, all at "
                     "once, into local memory, then a thread a query head's dimension, and combine them a group a head's 32 "
                     "dimensions, 32 threads a dimension; `:rotary` "
                     "(after :kernel) runs a decode step's query and key norms, rotary step and cache store as one "
                     "more generated kernel; `:pooled` (after :rotary) runs it a thread group a query head, its "
                     "squares summed through local memory")
