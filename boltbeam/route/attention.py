"""Decode attention split over the sequence, then a combine: the KV cache read by many groups at once.

At decode a query of one position attends over every cached position so far, a length tinygrad
holds as a variable. tinygrad cannot split a reduction whose length is a variable, so each head's
sum over the sequence runs in one group, however long the sequence is. This family writes the same
attention as tensor code whose long reduction has a fixed length: the cached keys and values, padded
to the cache's whole length, are cut into chunks of `chunk` positions; only the chunks that hold a
position so far are read (their count is the variable now, an axis of the output, not of a
reduction); each chunk gives its own maximum, sum of exponentials and weighted values, and a combine
over the chunks rescales them to one softmax, as a split-K flash-decoding kernel does.

`staged` is the family's second knob. Unstaged, tinygrad may fuse each chunk's weighted values and
sum into the combine, whose reduction then runs over every position in few groups again (on the
H200 one such kernel took 34 µs of a layer's ~48). Staged, the chunks' maxima, sums and weighted
values are written to buffers of their own first, so the weighted values keep the chunk as an
output axis, and the combine reduces over the chunks alone: two kernels more a layer.

`carried`, the third, sums each chunk's exponentials as one more column of its weighted values (a
column of ones beside the values), and the combine's denominator as one more column of its output:
two reductions fewer a layer (each chunk's sum, the combine's denominator), one division more.

`kernel`, the fourth, writes the same split as two kernels generated at tinygrad's UOp level
(decode_kernels, which picks one of FORMS, a function each for its partials and combine) in place of the
tensor code: one thread group for each key head and chunk holding a position so far (the grid follows
the position, as the tensor code's chunk axis does), a thread for each query head the key head serves
and position of the chunk; each thread's score goes to local memory, each query head's maximum is read
back from it, the exponentials go to local memory in turn, and the group writes each query head's
maximum and weighted values with their sum beside them; a second kernel combines the chunks. The
position comes in as the decode graph's own variable and the cache with the store that wrote this
token's key and value, so the kernels read it after.

`rotary`, with the generated kernels, runs a decode step's query and key norms, rotary step and store of
the key and value into the cache as one more kernel generated at tinygrad's UOp level (route/rotary.py)
in place of tinygrad's four or five, its query read in place by the partials (tinygrad copies any view of
a custom kernel's output another custom kernel reads, and the cache whole where one kernel reads two views
of it: the generated kernels read both where they lie). `pooled`, with rotary, has that kernel run a thread
group a query head and sum its squares through local memory.

It takes every attention a block computes through `Tensor.scaled_dot_product_attention` with one
query position and no mask (the decode step; the prefill keeps tinygrad's own), found by that fact,
not by the block's class or the model.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from boltbeam.errors import BadInput
from boltbeam.measure.prepared import Prepared
from boltbeam.route.family import thread_group_limit
from boltbeam.route import rotary
from boltbeam.route.layout import in_place
from boltbeam.units import DIGITS

LABEL = "split-attention"           # what it adds to a trace's route label (the family: route/split_attention.py)
SPACE = "split_attention"           # its knob's values: data/spaces.toml


@dataclass(frozen=True)
class Split:
    """One setting of the family: positions a chunk, whether the chunks' partials are staged, whether the
    sums of exponentials ride as a column of the weighted values, whether the generated kernels run, and in
    which form: narrow, wide, lanes (a thread a query head's dimension) or burst (a chunk's keys and values loaded
    first, sixteen bytes a load, all at once), unrolled or not; and whether the
    query and key norms, the rotary step and the cache store run as one generated kernel before them (pooled:
    a group a head, its sums of squares through local memory)."""
    chunk: int
    staged: bool = False
    carried: bool = False
    kernel: bool = False
    wide: bool = False
    unrolled: bool = False
    lanes: bool = False
    burst: bool = False
    rotary: bool = False
    pooled: bool = False

    def __post_init__(self):
        from boltbeam.foresight.space import families
        space = families()[SPACE].parameters
        if not (isinstance(self.chunk, int) and self.chunk in space["chunk"]
                and all(isinstance(getattr(self, k), bool) and int(getattr(self, k)) in space[k] for k in KNOBS)):
            raise BadInput(f"split attention {self.chunk!r}, {', '.join(f'{k} {getattr(self, k)!r}' for k in KNOBS)}: "
                           f"positions per chunk must be one of {', '.join(map(str, space['chunk']))}, "
                           f"{', '.join(KNOBS)} true or false (spaces.toml, family {SPACE})")
        if not self.admits({k: getattr(self, k) for k in KNOBS}):
            raise BadInput(f"split attention {self.flag}: staged and carried shape the tensor code, and the generated "
                           f"kernel takes neither; wide, lanes and burst shape the generated kernel alone, one of them, "
                           f"unrolled its wide, lanes or burst form; rotary runs before the generated kernel alone, "
                           f"pooled shapes rotary")

    @property
    def flag(self) -> str:
        return ":".join([str(self.chunk), *(k for k in KNOBS if getattr(self, k))])

    def stored(self) -> dict[str, int | bool]:
        return asdict(self)

    @classmethod
    def parse(cls, flag: str) -> "Split":
        """CHUNK[:staged][:carried], or CHUNK:kernel[:wide[:unrolled]|[:unrolled]:lanes|[:unrolled]:burst][:rotary[:pooled]]
        (profile --split-attention)."""
        chunk, *on = flag.split(":")
        if not DIGITS.fullmatch(chunk) or on != [k for k in KNOBS if k in on]:
            raise BadInput(f"--split-attention {flag}: expected {FLAG_FORMS}, e.g. 32, 32:staged:carried, "
                           f"32:kernel:wide:unrolled, 32:kernel:lanes:rotary or 32:kernel:burst")
        return cls(int(chunk), **{k: k in on for k in KNOBS})

    @staticmethod
    def admits(values: dict[str, int]) -> bool:
        """Whether spaces.toml's values make a setting: the generated kernel takes no tensor-code knob, the
        tensor code not the kernel's."""
        forms = sum(bool(values.get(k)) for k in FORM_KNOBS)
        if values.get("unrolled") and not forms or forms > 1 or values.get("rotary") and not values.get("kernel") \
                or values.get("pooled") and not values.get("rotary"):
            return False
        if values.get("kernel"):
            return not (values.get("staged") or values.get("carried"))
        return not forms

    def threads(self, group: int, head_dim: int) -> int:
        """Threads a group of the generated partials, at `group` query heads a key head: a position of the chunk
        for each query head, or (lanes, burst) a dimension of the head for each."""
        return group * (head_dim if self.lanes or self.burst else self.chunk)

    def unfit(self, head_dim: int) -> str | None:
        """Why a head of `head_dim` dimensions cannot take this setting (None: it can)."""
        return unfit(self.chunk, head_dim, self.wide, self.lanes, self.burst)


def unfit(chunk: int, head_dim: int, wide: bool, lanes: bool, burst: bool = False) -> str | None:
    """Why the generated kernel's form cannot take chunks of `chunk` at a head of `head_dim` (None: it can)."""
    if burst and (head_dim % WIDE_KEYS or chunk > head_dim):
        return (f"burst loads a key or value row {WIDE_KEYS} halves a load and scores a position of a query head a "
                f"thread (a thread a query head's dimension): the head size must be a multiple of {WIDE_KEYS}, and "
                f"the chunk no larger than it")
    if lanes and (head_dim % chunk or chunk % WIDE_KEYS):
        return (f"lanes splits a key row among head size / chunk threads, {WIDE_KEYS} keys a load: the head size "
                f"must be a multiple of the chunk, the chunk of {WIDE_KEYS}")
    if wide and (head_dim % WIDE_KEYS or (head_dim % chunk and chunk % head_dim)):
        return (f"wide reads a key row {WIDE_KEYS} keys a load and shares a row of values among a chunk's threads: "
                f"the head size must be a multiple of {WIDE_KEYS}, and of the chunk or a divisor of it")
    return None


KNOBS = ("staged", "carried", "kernel", "wide", "unrolled", "lanes", "burst", "rotary", "pooled")   # the family's switches, in the flag's order
FORM_KNOBS = ("wide", "lanes", "burst")              # the generated kernel's forms besides narrow: one at most
FLAG_FORMS = "CHUNK[:staged][:carried] or CHUNK:kernel[:wide[:unrolled]|[:unrolled]:lanes|[:unrolled]:burst][:rotary[:pooled]]"
WIDE_KEYS = 8                                        # halves of a key row a wide kernel's thread reads a load
COMBINE_LANES = 4                                    # lanes: threads a dimension of the combine, each a share of the chunks
COMBINE_STEP = 8                                     # lanes, unrolled: chunks a combine thread reads a loop step, at once
SPREAD_LANES = 32                                    # burst: threads a dimension of the spread combine, each its own chunks
SPREAD_DIMS = 32                                     # burst: dimensions a group of the spread combine takes, at most


def split_sdpa(q, k, v, chunk: int, total: int, staged: bool = False, carried: bool = False):
    """Attention of q (B, H, 1, Hd) over k, v (B, KvH, L, Hd), L <= total (variable), grouped query heads
    sharing each key head, by chunks of `chunk` positions of a sequence padded to `total`; `staged`
    writes each chunk's maximum, sum and weighted values to their own buffers before the combine;
    `carried` sums the exponentials as a column of ones beside the values, in the same reductions."""
    from tinygrad import Tensor
    B, H, _, Hd = q.shape
    KvH, L = k.shape[1], k.shape[2]
    G, C = H // KvH, total // chunk
    n = (L + chunk - 1) // chunk                                   # chunks that hold a position so far
    pad = ((0, 0), (0, 0), (0, total - L), (0, 0))
    # Key heads keep an axis of 1 for their query group. (Shrinking the chunks of a (B, KvH, C, chunk, Hd)
    # view and broadcasting it later sent tinygrad 0.13.0's code generator into endless recursion for
    # some head counts: 3 key heads of 3 queries each, 512 positions in chunks of 32.)
    kc = k.pad(pad).reshape(B, KvH, 1, C, chunk, Hd)[:, :, :, 0:n]          # (B, KvH, 1, n, chunk, Hd)
    vc = v.pad(pad).reshape(B, KvH, 1, C, chunk, Hd)[:, :, :, 0:n]
    s = (q.float().reshape(B, KvH, G, 1, 1, Hd) * kc.float()).sum(-1) * (1.0 / Hd ** 0.5)   # scores in float32
    s = s.reshape(B, H, s.shape[3], chunk)                                   # (B, H, n, chunk)
    s = (Tensor.arange(total, device=q.device).reshape(C, chunk)[0:n] < L).where(s, float("-inf"))
    stage = (lambda t: t.contiguous()) if staged else (lambda t: t)
    m = stage(s.max(-1))                                                     # each chunk's maximum
    p = (s - m.unsqueeze(-1)).exp()
    vf = vc.float().pad(((0, 0),) * 5 + ((0, 1),), value=1.0) if carried else vc.float()   # carried: ones beside
    width = vf.shape[-1]
    vh = vf.expand(B, KvH, G, vc.shape[3], chunk, width).reshape(B, H, vc.shape[3], chunk, width)
    o = stage((p.unsqueeze(-1) * vh).sum(-2))                                # (B, H, n, Hd[+1])
    w = (m - m.max(-1, keepdim=True)).exp()                                  # the combine: one softmax over all chunks
    if carried:                                                              # each chunk's sum is o's last column
        out = (o * w.unsqueeze(-1)).sum(-2)
        out = out[..., :Hd] / out[..., Hd:]
    else:
        total_p = stage(p.sum(-1))                                           # (B, H, n)
        out = (o * w.unsqueeze(-1)).sum(-2) / (total_p * w).sum(-1).unsqueeze(-1)
    return out.reshape(B, H, 1, Hd).cast(q.dtype)


def _cache_of(k):
    """The whole cache tensor a decode step's key view was cut from, with the store of this token's key
    and value it comes after: below the view's movements (shrink, reshape), the first AFTER, with the
    cache's five axes (keys and values, batch, key heads, positions, head size)."""
    from tinygrad import Tensor
    from tinygrad.uop.ops import GroupOp, Ops
    u = k.uop
    while u.op in GroupOp.Movement:
        u = u.src[0]
    if u.op is not Ops.AFTER or len(u.shape) != 5:
        raise BadInput(f"the generated attention kernel reads the cache its keys were cut from; below the key's "
                       f"view lies {u.op} of shape {u.shape}, not the cache after this token's store")
    return Tensor(u)


@dataclass(frozen=True)
class Decode:
    """The facts every form of the generated kernels reads: H query heads and KvH key heads of Hd dimensions, a
    cache of P positions cut in chunks of `chunk`, W values a chunk writes a query head (narrow: its weighted
    values, their sum beside; wide, lanes: a column a thread), L = position + 1 (the decode graph's variable,
    unbound), and whether a thread's reductions over a key row and a chunk's positions are written out in full."""
    H: int
    KvH: int
    Hd: int
    P: int
    chunk: int
    W: int
    L: Any
    unrolled: bool = False

    G = property(lambda self: self.H // self.KvH)                       # query heads a key head serves
    C = property(lambda self: -(-self.P // self.chunk))                 # chunks of the cache
    T = property(lambda self: self.G * self.chunk)                      # threads a group, narrow and wide
    n = property(lambda self: (self.L + self.chunk - 1) // self.chunk)  # the chunks holding a position so far: the grid
    scale = property(lambda self: 1.0 / math.sqrt(self.Hd))             # of a score

    def live(self, c, j):
        return c * self.chunk + j < self.L

    def at(self, g, c, half, j, d):
        """Where dimension d of chunk c's position j of key head g lies in the cache (half 0 keys, 1 values)."""
        return ((half * self.KvH + g) * self.P + c * self.chunk + j) * self.Hd + d

    def grid(self, threads: int):
        """A group a key head and live chunk, `threads` threads a group: (key head, chunk, thread)."""
        from tinygrad import UOp
        return UOp.special(self.KvH, "gidx0"), UOp.special(self.n, "gidx1"), UOp.special(threads, "lidx0")

    def over_thread(self, size, axis: int):
        """A thread's own reduction: written out in full where unrolled, so its loads go out together (a loop
        waits on each load before the next: latency, not bytes)."""
        from tinygrad import UOp
        from tinygrad.uop.ops import AxisType
        return UOp.range(size, axis, AxisType.UNROLL if self.unrolled else AxisType.REDUCE)


def _reduce(size, axis: int):
    from tinygrad import UOp
    from tinygrad.uop.ops import AxisType
    return UOp.range(size, axis, AxisType.REDUCE)        # (size may be the grid's n)


def _fold(op, size, axis: int, body, unrolled: bool = False, step: tuple[int, int] | None = None):
    """body over a range, reduced by op (body may give several values: each reduced over the one range); a range
    that can only be one long is its one value (tinygrad takes no such range). step (steps, axis): the indices
    taken `steps` a loop step, written out in full (their loads in flight together), body past `size` as well."""
    from tinygrad import UOp
    from tinygrad.uop.ops import AxisType
    inner, index = (), lambda k: k
    if step is not None:
        inner = (UOp.range(step[0], step[1], AxisType.UNROLL),)
        size, index = (size + step[0] - 1) // step[0], lambda k: k * step[0] + inner[0]
    if (size if isinstance(size, int) else size.vmax) == 1:
        ranges, out = inner, body(index(0))
    else:
        rng = UOp.range(size, axis, AxisType.UNROLL if unrolled else AxisType.REDUCE)
        ranges, out = (rng, *inner), body(index(rng))
    folded = lambda v: v.reduce(*ranges, arg=op) if ranges else v
    return tuple(map(folded, out)) if isinstance(out, tuple) else folded(out)


def _stored(slot: int, size: int, dtype, stores):
    """Local memory written at several (index, value, ranges) at once, read after every thread has (each value's
    ranges end with its store)."""
    return _stored_together((slot, size, dtype, stores))[0]


def _stored_together(*tables):
    """Several buffers of local memory, each (slot, size, dtype, stores) as _stored's, behind one barrier: every
    store's loads go out before any thread waits."""
    from tinygrad import UOp
    from tinygrad.dtype import AddrSpace
    done = []
    for slot, size, dtype, stores in tables:
        buf = UOp.placeholder((size,), dtype, slot, AddrSpace.LOCAL)
        done.append(buf.after(*(buf[i].store(v).end(*ends) for i, v, ends in stores)))
    barrier = done[0].barrier(*done[1:])
    return [d.after(barrier) for d in done]


def _local(slot: int, size: int, t, value):
    """value written to slot `slot` of the group's local memory at thread t, read after every thread has."""
    from tinygrad import dtypes
    return _stored(slot, size, dtypes.float, [(t, value, ())])


def _chunk_softmax(f: Decode, Q, KV, M, dk, over):
    """The narrow and wide partials' first half: thread (i, j) scores query head i against position j (its key
    row's dimensions dk, reduced over `over`) into local memory, reads back its head's maximum over the chunk,
    and writes its exponential to local memory in turn. (key head, chunk, thread, i, j, exponentials, the
    maximum's store: every thread of a query head holds the same maximum, right whether or not tinygrad keeps
    the store's gate.)"""
    from tinygrad import dtypes
    from tinygrad.uop.ops import Ops
    g, c, t = f.grid(f.T)
    i, j = t // f.chunk, t % f.chunk
    dot = (Q[(g * f.G + i) * f.Hd + dk].cast(dtypes.float) *
           KV[f.at(g, c, 0, j, dk).valid(f.live(c, j))].cast(dtypes.float)).reduce(*over, arg=Ops.ADD)
    s = f.live(c, j).where(dot * f.scale, float("-inf"))
    S = _local(0, f.T, t, s)
    jm = f.over_thread(f.chunk, 1)
    m = S[i * f.chunk + jm].reduce(jm, arg=Ops.MAX)
    E = _local(1, f.T, t, f.live(c, j).where((s - m).exp(), 0.0))
    return g, c, t, i, j, E, M[((g * f.G + i) * f.C + c).valid(j.eq(0))].store(m)


def narrow_partials(f: Decode, O, M, Q, KV):
    """A thread a query head and position, a key row a load at a time; then the group's G x W outputs (each
    query head's weighted values, their sum beside), T at a time."""
    from tinygrad import UOp, dtypes
    from tinygrad.uop.ops import KernelInfo, Ops
    O, M, Q, KV = (b.flatten() for b in (O, M, Q, KV))
    dk = _reduce(f.Hd, 0)
    g, c, t, _, _, E, store_m = _chunk_softmax(f, Q, KV, M, dk, (dk,))
    jv = f.over_thread(f.chunk, 3)
    G, W, T, C = f.G, f.W, f.T, f.C
    r = UOp.range(-(-G * W // T), 2)
    u = t + r * T
    inside = u < G * W
    gi, d = u // W, u % W                            # query head, dimension (the last: the sum)
    value = (d < f.Hd).where(KV[f.at(g, c, 1, jv, d).valid(f.live(c, jv) & (d < f.Hd) & inside)].cast(dtypes.float), 1.0)
    o = (E[(gi * f.chunk + jv).valid(inside)] * value).reduce(jv, arg=Ops.ADD)
    # A thread past the group's outputs writes to a spill slot of its own, not through a gated index
    # (tinygrad 0.13.0 dropped that gate where the outputs take one round: threads wrote other groups' rows).
    store_o = O[inside.where(((g * G + gi) * C + c) * W + d, f.H * C * W + t)].store(o).end(r)
    return UOp.sink(store_o, store_m, arg=KernelInfo(name=f"attention_partials_{G}x{f.chunk}", opts_to_apply=()))


def wide_partials(f: Decode, O, M, Z, Q, KV):
    """A thread a query head and position, its key row WIDE_KEYS halves a load; then thread (i, j) takes
    Hd/chunk consecutive dimensions of query head i's weighted values (loads and stores as wide, no thread idle,
    no output gated), and each chunk's sum goes to Z."""
    from tinygrad import UOp, dtypes
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    O, M, Z, Q, KV = (b.flatten() for b in (O, M, Z, Q, KV))
    e, ek = f.over_thread(f.Hd // WIDE_KEYS, 0), UOp.range(WIDE_KEYS, 10, AxisType.UNROLL)   # as the compiler unrolls it
    g, c, _, i, j, E, store_m = _chunk_softmax(f, Q, KV, M, e * WIDE_KEYS + ek, (e, ek))
    jv = f.over_thread(f.chunk, 3)
    per = max(1, f.Hd // f.chunk)                    # the value dimensions a thread takes
    w = UOp.range(per, 11, AxisType.UPCAST)
    d = j * per + w                                  # (a chunk wider than a head: j < Hd)
    value = KV[f.at(g, c, 1, jv, d).valid(f.live(c, jv) & (d < f.Hd))].cast(dtypes.float)
    o = (E[i * f.chunk + jv] * value).reduce(jv, arg=Ops.ADD)
    out = (g * f.G + i) * f.C + c
    store_o = O[out * f.W + d].store(o).end(w)       # (d >= Hd: a column no one reads)
    jz = f.over_thread(f.chunk, 4)
    store_z = Z[out.valid(j.eq(0))].store(E[i * f.chunk + jz].reduce(jz, arg=Ops.ADD))
    return UOp.sink(store_o, store_m, store_z,
                    arg=KernelInfo(name=f"attention_partials_{f.G}x{f.chunk}_wide{'_unrolled' if f.unrolled else ''}",
                                   opts_to_apply=()))


def lanes_partials(f: Decode, O, M, Z, Q, KV):
    """A thread for each query head and dimension: first S = Hd/chunk threads a key row (each a run of eight
    dimensions in every S*8, so a load instruction of S neighbours reads one stretch of the row) and each
    position's sum of their parts through local memory; then a query head's thread for each dimension of
    its weighted values, their sum beside."""
    from tinygrad import UOp, dtypes
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    O, M, Z, Q, KV = (b.flatten() for b in (O, M, Z, Q, KV))
    Hd, chunk, G = f.Hd, f.chunk, f.G
    S = Hd // chunk
    g, c, t = f.grid(G * Hd)
    i, j, s = t // Hd, (t // S) % chunk, t % S         # query head, position, lane of its key row
    ek = UOp.range(WIDE_KEYS, 10, AxisType.UNROLL)

    def run(e):                                       # the lane's e-th run of WIDE_KEYS dimensions
        dk = (e * S + s) * WIDE_KEYS + ek
        key = KV[f.at(g, c, 0, j, dk)].cast(dtypes.float)
        return (Q[(g * G + i) * Hd + dk].cast(dtypes.float) * key).reduce(ek, arg=Ops.ADD)
    D = _local(0, G * Hd, t, _fold(Ops.ADD, chunk // WIDE_KEYS, 0, run, unrolled=True))
    total = _fold(Ops.ADD, S, 1, lambda r: D[(t // S) * S + r], unrolled=True)
    score = f.live(c, j).where(total * f.scale, float("-inf"))
    Sc = _local(1, G * Hd, t, score)
    row = lambda jj: (i * chunk + jj) * S             # where a query head's position sits in local memory
    jm = f.over_thread(chunk, 2)
    m = Sc[row(jm)].reduce(jm, arg=Ops.MAX)           # the query head's maximum over the chunk
    E = _local(2, G * Hd, t, f.live(c, j).where((score - m).exp(), 0.0))
    d, jv = t % Hd, f.over_thread(chunk, 3)           # (one range: the values' sum and the exponentials' in one loop)
    o = (E[row(jv)] * KV[f.at(g, c, 1, jv, d).valid(f.live(c, jv))].cast(dtypes.float)).reduce(jv, arg=Ops.ADD)
    out = (g * G + i) * f.C + c
    # (every thread of a query head holds the same maximum and sum: right whether or not tinygrad keeps the gate)
    return UOp.sink(O[out * Hd + d].store(o), M[out.valid(d.eq(0))].store(m),
                    Z[out.valid(d.eq(0))].store(E[row(jv)].reduce(jv, arg=Ops.ADD)),
                    arg=KernelInfo(name=f"attention_partials_{G}x{chunk}_lanes{S}{'_unrolled' if f.unrolled else ''}",
                                   opts_to_apply=()))


def burst_partials(f: Decode, O, M, Z, Q, KV):
    """A thread for each query head and dimension, as lanes, but the chunk's keys and values are loaded first and at
    once: R = Hd/8 runs of eight dimensions a key or value row, a run a load, B = chunk x R / threads runs of each a
    thread (every load of the group in flight together, and each key row read once for all the query heads it serves);
    each key run's part of every query head's score and each value run go to local memory. Then each query head's
    thread for dimension d sums the parts of its score at position d % chunk, the head's maximum and exponentials go
    through local memory, and the thread sums its dimension's weighted values from the values in local memory."""
    from tinygrad import UOp, dtypes
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    O, M, Z, Q, KV = (b.flatten() for b in (O, M, Z, Q, KV))
    Hd, chunk, G = f.Hd, f.chunk, f.G
    R, T = Hd // WIDE_KEYS, G * Hd
    B = burst_runs(G, Hd, chunk)
    g, c, t = f.grid(T)
    ek = UOp.range(WIDE_KEYS, 10, AxisType.UNROLL)    # a run's eight dimensions: one load
    parts, values = [], []
    for b in range(B):
        u = t + b * T                                  # the run: position u // R, dimensions (u % R) * 8 + ek
        j, dk = u // R, (u % R) * WIDE_KEYS + ek
        ok = f.live(c, j) & (u < chunk * R) if B * T > chunk * R else f.live(c, j)
        key = KV[f.at(g, c, 0, j, dk).valid(ok)].cast(dtypes.float)
        values.append((u * WIDE_KEYS + ek, KV[f.at(g, c, 1, j, dk).valid(ok)], (ek,)))
        parts += [((i * B * T + u), (Q[(g * G + i) * Hd + dk].cast(dtypes.float) * key).reduce(ek, arg=Ops.ADD), ())
                  for i in range(G)]
    P, V = _stored_together((0, G * B * T, dtypes.float, parts), (1, B * T * WIDE_KEYS, KV.dtype.base, values))
    h, d = t // Hd, t % Hd                             # the query head and dimension this thread writes
    j = d % chunk                                      # the position it scores (chunk <= Hd: every position taken)
    total = _fold(Ops.ADD, R, 0, lambda r: P[h * B * T + j * R + r], unrolled=True)
    score = f.live(c, j).where(total * f.scale, float("-inf"))
    Sc = _local(2, T, t, score)
    jm = f.over_thread(chunk, 1)
    m = Sc[h * Hd + jm].reduce(jm, arg=Ops.MAX)       # its query head's maximum over the chunk
    E = _local(3, T, t, f.live(c, j).where((score - m).exp(), 0.0))
    jv = f.over_thread(chunk, 3)                      # (one range: the values' sum and the exponentials' in one loop)
    out = (g * G + h) * f.C + c
    # (every thread of a query head holds the same maximum and sum: right whether or not tinygrad keeps the gate)
    store_m, store_z = M[out.valid(d.eq(0))].store(m), Z[out.valid(d.eq(0))].store(E[h * Hd + jv].reduce(jv, arg=Ops.ADD))
    o = (E[h * Hd + jv] * V[jv * Hd + d].cast(dtypes.float)).reduce(jv, arg=Ops.ADD)   # (a row's runs lie in order)
    return UOp.sink(O[out * Hd + d].store(o), store_m, store_z,
                    arg=KernelInfo(name=f"attention_partials_{G}x{chunk}_burst{B}{'_unrolled' if f.unrolled else ''}",
                                   opts_to_apply=()))


def burst_runs(group: int, head_dim: int, chunk: int) -> int:
    """Runs of keys, and of values, a thread of the burst partials loads: a chunk's rows of head_dim / 8 runs each,
    shared among its group x head_dim threads."""
    return -(-chunk * (head_dim // WIDE_KEYS) // (group * head_dim))


def _shared_max(device: str) -> int:
    """The device's local memory a group, read while tinygrad.llm's blocks are traced as functions, where tinygrad
    forbids opening a device (function.py; its own codegen reads the renderer the same way): the model's device is
    already open by then."""
    from tinygrad import Device
    from tinygrad.helpers import Context
    with Context(ALLOW_DEVICE_USAGE=1):
        return Device[device].renderer.shared_max


def burst_local_bytes(group: int, head_dim: int, chunk: int, value_bytes: int) -> int:
    """The local memory a group of the burst partials holds: every query head's parts of the scores, the values (in
    the cache's type, of `value_bytes`), the scores and the exponentials."""
    threads = group * head_dim
    runs = burst_runs(group, head_dim, chunk) * threads
    return 4 * group * runs + value_bytes * runs * WIDE_KEYS + 2 * 4 * threads


def combine(f: Decode, Y, O, M, Z=None):
    """A group a query head, a thread a dimension: each chunk's weighted values rescaled to one softmax and summed
    over the chunks, over the chunks' sums rescaled alike. Narrow (no Z): each chunk's sum the last column of its
    output row, in a loop of its own; wide: the sums apart (Z), summed in the values' loop."""
    from tinygrad import UOp
    from tinygrad.uop.ops import KernelInfo, Ops
    wide = Z is not None
    Y, O, M = (b.flatten() for b in (Y, O, M))
    C, W = f.C, f.W
    h, d = UOp.special(f.H, "gidx0"), UOp.special(f.Hd, "lidx0")
    c0 = _reduce(f.n, 0)
    top = M[h * C + c0].reduce(c0, arg=Ops.MAX)
    share = lambda c: (M[h * C + c] - top).exp()    # a chunk's share of one softmax
    c1 = _reduce(f.n, 1)
    c2 = c1 if wide else _reduce(f.n, 2)
    sums = Z.flatten()[h * C + c2] if wide else O[(h * C + c2) * W + f.Hd]
    out = (O[(h * C + c1) * W + d] * share(c1)).reduce(c1, arg=Ops.ADD) / (sums * share(c2)).reduce(c2, arg=Ops.ADD)
    return Y[h * f.Hd + d].store(out).sink(arg=KernelInfo(name=f"attention_combine_{C}{'_wide' if wide else ''}",
                                                          opts_to_apply=()))


def lanes_combine(f: Decode, Y, O, M, Z):
    """A group a query head, COMBINE_LANES threads a dimension, each summing every COMBINE_LANES-th chunk
    (the chunks' maxima first read a thread a chunk, their maximum through local memory), their sums added
    through local memory (all of a dimension's threads write the same value), written in the query's type. Unrolled,
    its loops over the chunks (their maxima's maximum, the sums) take COMBINE_STEP chunks a step, written out."""
    from tinygrad import UOp
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    Y, O, M, Z = (b.flatten() for b in (Y, O, M, Z))
    R, Hd, C, n = COMBINE_LANES, f.Hd, f.C, f.n
    h, t = UOp.special(f.H, "gidx0"), UOp.special(R * Hd, "lidx0")
    d, r = t % Hd, t // Hd

    def chunk_max(k):                               # a thread's chunks for the maximum: t, t + R*Hd, ...
        cm = t + k * (R * Hd)
        return (cm < n).where(M[(h * C + cm).valid(cm < n)], float("-inf"))
    A = _local(0, R * Hd, t, _fold(Ops.MAX, -(-C // (R * Hd)), 0, chunk_max))
    slot = lambda u: (u < R * Hd).where(A[u.valid(u < R * Hd)], float("-inf"))   # (slots past R*Hd hold nothing more)
    if f.unrolled:                                  # (the slots from n on hold no chunk's maximum: -inf)
        top = _fold(Ops.MAX, n, 1, slot, step=(COMBINE_STEP, 4))
    else:
        u = _reduce(n, 1)
        top = slot(u).reduce(u, arg=Ops.MAX)

    def sums(k):                                    # a thread's chunks for the sums: r, r + R, ...
        c = r + k * R
        w = (c < n).where((M[(h * C + c).valid(c < n)] - top).exp(), 0.0)      # a chunk's share of one softmax
        return O[((h * C + c) * Hd + d).valid(c < n)] * w, Z[(h * C + c).valid(c < n)] * w
    acc, z = _fold(Ops.ADD, (n + R - 1) // R, 2, sums, step=(COMBINE_STEP, 5) if f.unrolled else None)
    B, Bz = _local(1, R * Hd, t, acc), _local(2, R * Hd, t, z)
    rr = UOp.range(R, 3, AxisType.UNROLL)
    out = B[rr * Hd + d].reduce(rr, arg=Ops.ADD) / Bz[rr * Hd + d].reduce(rr, arg=Ops.ADD)
    name = f"attention_combine_{C}_lanes{R}" + (f"_unrolled{COMBINE_STEP}" if f.unrolled else "")
    return Y[h * Hd + d].store(out.cast(Y.dtype.base)).sink(arg=KernelInfo(name=name, opts_to_apply=()))


def spread_slice(head_dim: int) -> int:
    """Dimensions of a query head a group of the spread combine takes: a warp's loads of a row at most."""
    return math.gcd(head_dim, SPREAD_DIMS)


def spread_lanes(chunks: int) -> int:
    """Threads a dimension of the spread combine, at a cache of `chunks` chunks: no more lanes than chunks."""
    return min(SPREAD_LANES, chunks)


def spread_combine(f: Decode, Y, O, M, Z):
    """A group a query head and slice of Ds dimensions (Ds = spread_slice(Hd)), R = spread_lanes(C) threads a dimension,
    lane r taking the chunks r, r + R, ...: each lane's maximum over its chunks through local memory, their maximum
    read back by every thread; then each lane's weighted values and sums rescaled to it, through local memory, and
    each thread's dimension summed over the lanes (every thread of a dimension writes the same value), in the
    query's type. More groups than lanes_combine's one a query head, and a lane's loops over its chunks R times
    shorter: a loop waits on each load (latency, not bytes)."""
    from tinygrad import UOp, dtypes
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    Y, O, M, Z = (b.flatten() for b in (Y, O, M, Z))
    R, Ds, Hd, C, n = spread_lanes(f.C), spread_slice(f.Hd), f.Hd, f.C, f.n
    h, s, t = UOp.special(f.H, "gidx0"), UOp.special(Hd // Ds, "gidx1"), UOp.special(R * Ds, "lidx0")
    dl, r = t % Ds, t // Ds
    d, steps = s * Ds + dl, (n + R - 1) // R
    chunk = lambda k: r + k * R                     # lane r's k-th chunk
    live = lambda c: c < n
    at = lambda c: (h * C + c).valid(live(c))
    Ml = _local(0, R * Ds, t, _fold(Ops.MAX, steps, 0, lambda k: live(chunk(k)).where(M[at(chunk(k))], float("-inf"))))
    rt = UOp.range(R, 2, AxisType.UNROLL)
    top = Ml[rt * Ds + dl].reduce(rt, arg=Ops.MAX)  # (a lane without a chunk holds -inf)

    def sums(k):
        c = chunk(k)
        w = live(c).where((M[at(c)] - top).exp(), 0.0)      # the chunk's share of one softmax
        return O[((h * C + c) * Hd + d).valid(live(c))] * w, Z[at(c)] * w
    acc, z = _fold(Ops.ADD, steps, 1, sums)
    B, Bz = _stored_together((1, R * Ds, dtypes.float, [(t, acc, ())]), (2, R * Ds, dtypes.float, [(t, z, ())]))
    rr = UOp.range(R, 3, AxisType.UNROLL)
    out = B[rr * Ds + dl].reduce(rr, arg=Ops.ADD) / Bz[rr * Ds + dl].reduce(rr, arg=Ops.ADD)
    return Y[h * Hd + d].store(out.cast(Y.dtype.base)).sink(
        arg=KernelInfo(name=f"attention_combine_{C}_spread{R}x{Ds}", opts_to_apply=()))


@dataclass(frozen=True)
class Form:
    """One form of the generated kernels: its partials and combine, the values a chunk writes a query head (of
    the head size and the chunk), whether each chunk's sum lies in a buffer of its own (else beside its values,
    the partials' output then holding a spill slot a thread), and whether the combine writes the query's type."""
    partials: Callable
    combine: Callable
    row: Callable[[int, int], int]
    sums_apart: bool
    query_type: bool = False


FORMS = {
    "narrow": Form(narrow_partials, combine, lambda head_dim, chunk: head_dim + 1, sums_apart=False),
    "wide": Form(wide_partials, combine, max, sums_apart=True),
    "lanes": Form(lanes_partials, lanes_combine, max, sums_apart=True, query_type=True),
    "burst": Form(burst_partials, spread_combine, max, sums_apart=True, query_type=True),
}


def decode_kernels(q, k, chunk: int, wide: bool = False, unrolled: bool = False, lanes: bool = False,
                   burst: bool = False):
    """Attention of q (1, H, 1, Hd) over the cache positions so far, as two kernels written at tinygrad's UOp
    level in one of FORMS, picked here as ggml-cuda picks among its attention kernels: partials (a group for
    each key head and chunk holding a position so far; scores and exponentials through local memory; each query
    head's maximum, weighted values and their sum written out) and a combine over the chunks. k is the decode
    step's key view of the cache (1, KvH, L, Hd), L = position + 1. `wide`: wide_partials and the wide combine;
    `lanes`: lanes_partials (at chunks of 32, four times the wide form's threads, each with a quarter of its
    steps) and lanes_combine; `burst`: burst_partials (a lanes group whose keys and values are loaded first, at
    once) and spread_combine; none: narrow_partials and the narrow combine. `unrolled` (with wide, lanes or burst):
    the partials' loops over a key row (wide) and a chunk's positions written out in full; lanes, the combine's
    loops over the chunks COMBINE_STEP chunks a step, written out (spread_combine's loops are short: kept)."""
    from tinygrad import Tensor, dtypes
    B, H, _, Hd = q.shape
    if why := unfit(chunk, Hd, wide, lanes, burst):
        raise BadInput(f"split attention at chunks of {chunk} and a head of {Hd} dimensions: {why}")
    form = FORMS["burst" if burst else "lanes" if lanes else "wide" if wide else "narrow"]
    cache = _cache_of(k)                              # (2, 1, KvH, P, Hd)
    group, value = H // k.shape[1], cache.dtype.itemsize   # (the cache's type: tinygrad.llm's float32, or half_cache's)
    if burst and (local := burst_local_bytes(group, Hd, chunk, value)) > (room := _shared_max(q.device)):
        raise BadInput(f"split attention's burst form at chunks of {chunk} holds {local} bytes of local memory a group "
                       f"({group} query heads a key head, {Hd} dimensions, a cache of {value}-byte values); "
                       f"device {q.device} allows {room}")
    f = Decode(H, k.shape[1], Hd, cache.shape[3], chunk, form.row(Hd, chunk), k.shape[2].unbind_all()[0], unrolled)
    buffer = lambda *shape, dtype=dtypes.float32: Tensor.empty(*shape, dtype=dtype, device=q.device)
    sums = (buffer(H, f.C),) if form.sums_apart else ()
    partials = (buffer(H * f.C * f.W + (0 if form.sums_apart else f.T)), buffer(H, f.C), *sums)   # narrow: + spill
    query = in_place(q)          # (the rotary kernel's output, read where it lies: its elements are in this order)
    written = Tensor.custom_kernel(*partials, q.reshape(H, Hd) if query is None else query, cache,
                                   fxn=functools.partial(form.partials, f))[:len(partials)]
    Y = Tensor.custom_kernel(buffer(H, Hd, dtype=q.dtype if form.query_type else dtypes.float32), *written,
                             fxn=functools.partial(form.combine, f))[0]
    return Y.reshape(B, H, 1, Hd).cast(q.dtype)


def decode_attention(split: Split, q, k, v, total: int):
    """The selector: a decode step's attention (one query position, query heads a multiple of the key heads; the
    generated kernels, one sequence) by chunks as `split` says, as tensor code (split_sdpa) or generated kernels
    (decode_kernels, which picks their form); None where the facts leave it to tinygrad's own."""
    if not (q.shape[2] == 1 and q.shape[1] % k.shape[1] == 0 and (q.shape[0] == 1 or not split.kernel)):
        return None
    if split.kernel:
        return decode_kernels(q, k, split.chunk, split.wide, split.unrolled, split.lanes, split.burst)
    return split_sdpa(q, k, v, split.chunk, total, split.staged, split.carried)


@dataclass(frozen=True)
class Scheduled:
    """One kernel the compiler schedules for a block's decode attention: its output elements, and
    whether it reads the KV cache."""
    outputs: int
    reads_cache: bool


@functools.cache
def scheduled(split: Split, heads: int, kv_heads: int, head_dim: int, positions: int, depth: int) -> tuple[Scheduled, ...]:
    """The kernels tinygrad's scheduler makes of one block's decode attention in this setting, at these
    head counts, a cache of `positions` and a query at `depth`: asked on the CPU, nothing run. The
    generated kernels are known by construction: the partials, a thread for each query head and position
    (lanes: dimension) of the chunks holding a position so far (the rest exit), and the combine, a thread an
    output (lanes: COMBINE_LANES threads an output; burst: spread_lanes of the cache's chunks)."""
    from tinygrad import Context, Device, Tensor, UOp
    from boltbeam.foresight.future import outputs_at
    total = -(-positions // split.chunk) * split.chunk
    if split.kernel:
        live = -(-(min(depth, total - 1) + 1) // split.chunk)
        threads = split.threads(heads // kv_heads, head_dim)
        lanes = spread_lanes(total // split.chunk) if split.burst else COMBINE_LANES if split.lanes else 1
        return Scheduled(kv_heads * live * threads, True), Scheduled(heads * head_dim * lanes, False)
    with Context(DEV="CPU"):    # on another default device, the bound position would be a kernel and a copy
        cache = Tensor.empty(2, 1, kv_heads, total, head_dim, device="CPU", dtype="half")
        p = UOp.variable("start_pos", 0, total - 1).bind(min(depth, total - 1))
        q = Tensor.empty(1, heads, 1, head_dim, device="CPU", dtype="half")
        out = split_sdpa(q, cache[0, :, :, 0:p + 1], cache[1, :, :, 0:p + 1], split.chunk, total, split.staged,
                         split.carried)
        linear, var_vals = out.linear_with_vars()
    renderer = Device["CPU"].renderer
    return tuple(Scheduled(outputs_at(call.src[0], renderer, var_vals), any(b is cache.uop.base for b in call.src[1:]))
                 for call in linear.src)


@contextlib.contextmanager
def _split_decode_attention(split: Split, total: int, taken):
    """Within the block's attention: a decode step's attention (one query, no mask) goes by chunks;
    `taken()` is called each time it does."""
    from tinygrad import Tensor
    original = Tensor.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False):
        if attn_mask is None and not is_causal and (out := decode_attention(split, q, k, v, total)) is not None:
            taken()
            return out
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa)

    Tensor.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        Tensor.scaled_dot_product_attention = original


def _check_threads(census, model_path: str, setting: Split) -> None:
    """The generated kernel needs thread groups with local memory, and a group for a chunk's positions
    times the query heads a key head serves: one line where the device or the model rules it out."""
    from tinygrad import Device
    most = thread_group_limit(f"--split-attention {setting.flag}")
    f = census.facts
    group = f.heads // max(1, f.kv_heads)
    threads = setting.threads(group, f.head_dim)
    if threads > most:
        raise BadInput(f"model {model_path}: --split-attention {setting.flag} needs {threads} threads a group ({group} "
                       f"query heads a key head x {f.head_dim if setting.lanes or setting.burst else setting.chunk} "
                       f"{'dimensions' if setting.lanes or setting.burst else 'positions'}); device {Device.DEFAULT} allows {most}")
    combine = (SPREAD_LANES, spread_slice(f.head_dim)) if setting.burst else (COMBINE_LANES, f.head_dim) if setting.lanes else None
    if combine and combine[0] * combine[1] > most:
        raise BadInput(f"model {model_path}: --split-attention {setting.flag} combines with up to {combine[0]} threads "
                       f"a dimension, {combine[0] * combine[1]} a group; device {Device.DEFAULT} allows {most}")
    if setting.pooled and f.head_dim > most:
        raise BadInput(f"model {model_path}: --split-attention {setting.flag} runs the rotary kernel a thread a "
                       f"dimension, {f.head_dim} a group; device {Device.DEFAULT} allows {most}")
    if why := setting.unfit(f.head_dim):
        raise BadInput(f"model {model_path}: --split-attention {setting.flag} at a head of {f.head_dim} dimensions: {why}")


def install(net, census, model_path: str, setting: Split) -> Prepared:
    """Wrap every block's attention so its decode steps split over the sequence as `setting` says."""
    t0 = time.perf_counter()
    prepared = Prepared(LABEL, asdict(setting))
    total = -(-net.max_context // setting.chunk) * setting.chunk     # the cache's positions, whole chunks
    if setting.kernel:
        _check_threads(census, model_path, setting)
    split_blocks: set[int] = set()
    kept: dict[str, int] = {}          # rotary: why blocks keep tinygrad's norms, rotary step and store
    for i, block in enumerate(getattr(net, "blk", [])):
        attention = getattr(block, "_attention", None)
        if attention is None:
            continue
        prepared.eligible += 1
        if setting.rotary:
            if (why := rotary.unfit(block)) is None:
                attention = rotary.RotaryAttention(block, attention, True, setting.pooled)   # (kernel: groups checked)
                for w, role in zip(attention.weights, ("attn_q_norm", "attn_k_norm")):   # its copies of the norms
                    if w is not None:
                        prepared.placed[id(w.uop.base.buffer.base)] = tuple(
                            t for t in census.tensors if t.block == i and t.role == role)
            else:
                kept[why] = kept.get(why, 0) + 1

        def taken(i=i):   # a block counts once it has run a decode step's attention by chunks
            split_blocks.add(i)
            prepared.applied = len(split_blocks)

        def split(x, start_pos, attention=attention, taken=taken):
            with _split_decode_attention(setting, total, taken):
                return attention(x, start_pos)
        block._attention = split
    if not prepared.eligible:
        raise BadInput(f"model {model_path}: no block computes attention: nothing to split")
    if setting.rotary:
        if sum(kept.values()) == prepared.eligible:
            raise BadInput(f"model {model_path}: --split-attention {setting.flag}: no block's attention takes the rotary "
                           f"kernel ({'; '.join(kept)})")
        prepared.notes.append(f"rotary: {prepared.eligible - sum(kept.values())} of {prepared.eligible} blocks' query "
                              f"and key norms, rotary step and cache store in one generated kernel"
                              + (" (a group a head, its squares summed through local memory)" if setting.pooled else "")
                              + "".join(f"; {n} kept: {why}" for why, n in kept.items()))
    prepared.seconds = time.perf_counter() - t0
    return prepared
