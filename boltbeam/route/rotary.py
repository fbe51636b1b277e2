"""A decode step's query and key norms, rotary step and cache store as one kernel (split attention's `rotary`).

tinygrad.llm's attention block, at a decode step, norms each query and key head (an RMS norm over the
head, where the block has one), turns the first rope_dim dimensions of each by the rotary table's row for
the position, and stores this token's key and value into the cache. tinygrad schedules that as a mean of
squares for the queries, another for the keys, the queries' normed and turned vector, the keys' with the
store of both halves into the cache, and, where the layout stacks query and key into one product, a copy of
that product first: five kernels a block (on the H200, 7.8 µs a block of a ~105 µs one).

rotary_kernel is the same as one kernel written at tinygrad's UOp level: a thread for each query head and
dimension; each sums its head's squares and its key head's (each thread reads both rows itself, through the
caches, not through local memory), writes its turned query dimension, and the key head's turned dimension and
value into the cache at the position (the query heads a key head serves write the same bytes there). It reads
the projections' outputs where they lie (layout.in_place), and its query output and the cache are read where
they lie by split attention's generated kernels, so neither side copies. (On the H200 it took 4.5 µs a block in
32 groups, bench/h200/rotary/: the sums' chains of loads, not bytes.)

`pooled`: a thread group a query head and a thread a dimension, each thread loading its dimension of the query,
key and value heads (and the rotary partner's) once; the group sums the squares through local memory in two
stages (a rows x b partials, then the a row sums), so no thread waits on a chain of Hd loads.
"""
from __future__ import annotations

import math

from boltbeam.route.layout import LayoutLinear, in_place

QUERY_THREADS = 128          # a thread group's threads (at most a head's dimensions) where the device runs groups
SUM_STEP = 8                 # the squares a thread sums a loop step


def rotary_kernel(q, k, v, q_norm, k_norm, eps: float, freqs, cache, start_pos, heads: int, head_dim: int,
                  rope_dim: int, thread_groups: bool, pooled: bool = False):
    """The normed, turned query (heads x head_dim), and the cache after this token's key and value are stored.
    q, k, v: (tensor, offset) of the projections' outputs, the heads' values from that offset on (one token);
    q_norm, k_norm: the norms' weights (head_dim), or None where the block has none; freqs (positions, rope_dim):
    the cosines then the sines of each position; cache (2, 1, kv_heads, positions, head_dim); start_pos the
    decode graph's bound variable (or a number). pooled (thread_groups): the squares summed through local memory."""
    from tinygrad import Tensor, UOp, dtypes
    from tinygrad.codegen.opt import Opt, OptOps
    from tinygrad.dtype import least_upper_dtype
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    kv_heads, P = cache.shape[2], cache.shape[3]
    G, half, Hd = heads // kv_heads, rope_dim // 2, head_dim
    sources = list({id(t.uop): t for t, _ in (q, k, v)}.values())
    slot = lambda part: next(i for i, t in enumerate(sources) if t.uop is part[0].uop)
    normed = [w for w in (q_norm, k_norm) if w is not None]
    # the model's dtypes: a norm casts back to its input's type before its weight; the table is float32
    out_dtype = least_upper_dtype(q[0].dtype, *(w.dtype for w in normed), freqs.dtype)

    def kernel(Y, C, F, *rest, pos=start_pos):
        Y, C, F = Y.flatten(), C.flatten(), F.flatten()
        srcs, weights = [s.flatten() for s in rest[:len(sources)]], [w.flatten() for w in rest[len(sources):]][:len(normed)]
        if pooled:
            h, d = UOp.special(heads, "gidx0"), UOp.special(Hd, "lidx0")
        else:
            h, d = UOp.range(heads, 0), UOp.range(Hd, 1)
        kh = h // G
        value = lambda part, head, i: srcs[slot(part)][part[1] + head * Hd + i].cast(dtypes.float)
        normed_heads = {name: (p, hd) for name, p, hd, w in (("q", q, h, q_norm), ("k", k, kh, k_norm)) if w is not None}
        sums = dict(zip(normed_heads, pooled_sums(d, [(lambda i, p=p, hd=hd: value(p, hd, i))
                                                      for p, hd in normed_heads.values()], Hd))) if pooled else {}

        def sum_of_squares(part, head, axis, name):
            if pooled:
                return sums[name]
            i = UOp.range(Hd, axis, AxisType.REDUCE)
            return (value(part, head, i) * value(part, head, i)).reduce(i, arg=Ops.ADD)

        def turned(part, head, weight, axis, name):
            if weight is None:
                norm = lambda i: value(part, head, i)
            else:
                scale = (sum_of_squares(part, head, axis, name) * (1.0 / Hd) + eps).sqrt().reciprocal()
                cast = (lambda x: x) if part[0].dtype == dtypes.float else (lambda x: x.cast(part[0].dtype).cast(dtypes.float))
                norm = lambda i: cast(value(part, head, i) * scale) * weight[i].cast(dtypes.float)
            first = d < half
            j = first.where(d, d - half)                              # the pair's place in the table's row
            partner = first.where(d + half, d - half)
            cos, sin = F[pos * rope_dim + j % half], F[pos * rope_dim + half + j % half]
            rope = norm(d) * cos + first.where(-1.0, 1.0) * norm(partner) * sin
            return (rope if rope_dim == Hd else (d < rope_dim).where(rope, norm(d)))
        w_q = weights[0] if q_norm is not None else None
        w_k = weights[-1] if k_norm is not None else None
        at = lambda half_, head: ((half_ * kv_heads + head) * P + pos) * Hd + d
        V, v_at = srcs[slot(v)], v[1]
        stores = UOp.group(Y[h * Hd + d].store(turned(q, h, w_q, 2, "q").cast(Y.dtype.base)),
                           C[at(0, kh)].store(turned(k, kh, w_k, 3, "k").cast(C.dtype.base)),
                           C[at(1, kh)].store(V[v_at + kh * Hd + d].cast(C.dtype.base)))
        if pooled:
            return stores.sink(arg=KernelInfo(name=f"rotary_{heads}x{Hd}_pooled", opts_to_apply=()))
        # a group of a head's threads where the device runs groups; each sum of squares SUM_STEP values a step
        # (wide loads, one loop step a load's latency)
        opts = ((Opt(OptOps.LOCAL, 1, math.gcd(Hd, QUERY_THREADS)),) if thread_groups else ()) + tuple(
            Opt(OptOps.UNROLL, axis, SUM_STEP) for axis in range(len(normed)) if Hd % SUM_STEP == 0)
        return stores.end(h, d).sink(arg=KernelInfo(name=f"rotary_{heads}x{Hd}", opts_to_apply=opts))

    y = Tensor.empty(heads * Hd, dtype=out_dtype, device=cache.device)
    y, cache, *_ = custom_kernel_at(start_pos, y, cache, freqs, *sources, *normed, fxn=kernel)
    return y, cache


def pooled_sums(t, values, n: int) -> list:
    """Each of `values` (a function of a dimension) squared by thread t of a group of n and summed over the
    group through local memory: the squares, then rows of b partials (a rows, a b = n, a the largest divisor
    of n at most its square root) each summed by a thread, then every thread sums the a rows' sums; one
    barrier a stage for all the sums. The sums, as every thread holds them."""
    from tinygrad import UOp, dtypes
    from tinygrad.dtype import AddrSpace
    from tinygrad.uop.ops import AxisType, Ops
    a = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    b = n // a

    def stage(terms, slot0):
        bufs = [UOp.placeholder((n,), dtypes.float, slot0 + i, AddrSpace.LOCAL)[t].set(x) for i, x in enumerate(terms)]
        done = bufs[0].barrier(*bufs[1:])
        return [buf.after(done) for buf in bufs]

    def summed(terms, size, axis):       # (written out: a thread's local loads go out together)
        i = UOp.range(size, axis, AxisType.UNROLL)
        return [x(i).reduce(i, arg=Ops.ADD) for x in terms]
    if not values:
        return []
    squares = stage([v(t) * v(t) for v in values], 0)
    rows = stage(summed([lambda r, S=S: S[(t % a) * b + r] for S in squares], b, 20), len(values))
    return summed([lambda r, R=R: R[r] for R in rows], a, 21)


def custom_kernel_at(position, *tensors, fxn):
    """tinygrad's Tensor.custom_kernel, with a position: a bound variable (the decode graph's) rides with the
    kernel's buffers as an argument of its call, so the graph binds it for this kernel (and any other that reads
    the variable) where no other kernel takes it; fxn gets the variable itself after the buffers (a number
    position goes in as it is)."""
    from tinygrad import Tensor
    from tinygrad.uop.ops import Ops, UOp
    if not isinstance(position, UOp):
        return Tensor.custom_kernel(*tensors, fxn=lambda *bufs: fxn(*bufs, pos=position))
    srcs = tuple(t.uop if t.uop.op is Ops.AFTER else t.uop.contiguous() for t in tensors)
    holders = [s.placeholder_like(slot=i) for i, s in enumerate(srcs)]
    call = fxn(*holders, pos=position.unbind()[0]).call(*srcs, position)
    return [Tensor(s.after(call)) for s in srcs]


def source_of(layer, x):
    """(tensor, offset): where a projection's output for x lies, for a kernel to read it there: a stacked layout
    product's rows from their start, uncopied (one product for the stack); elsewhere the layer's own output."""
    if isinstance(layer, LayoutLinear) and layer.form == "kernel" and layer.bias is None \
            and all(isinstance(n, int) for n in x.shape):
        product = in_place(layer.planes.gemv(x, layer.form, layer.norm))
        if product is not None:
            return product, layer.rows.start if layer.rows is not None else 0
    out = layer(x)
    lies = in_place(out)
    return (out.reshape(-1) if lies is None else lies), 0


class RotaryAttention:
    """A block's attention as tinygrad.llm's TransformerBlock computes it, with a decode step's query and key
    norms, rotary step and cache store as rotary_kernel (the norms' weights realized once, in their type); a
    prefill (more than one position) keeps the block's own (`original`); pooled: rotary_kernel's pooled form."""
    def __init__(self, block, original, thread_groups: bool, pooled: bool = False):
        self.block, self.original, self.thread_groups, self.pooled = block, original, thread_groups, pooled
        norms = (block.attn_q_norm, block.attn_k_norm) if block.config.qk_norm else ()
        self.weights = tuple(n.weight.contiguous().realize() for n in norms) or (None, None)
        self.eps = float(norms[0].eps) if norms else 0.0

    def __call__(self, x, start_pos):
        B, T, _ = x.shape
        if not (B == 1 and isinstance(T, int) and T == 1):       # (a prefill's length is a variable)
            return self.original(x, start_pos)
        b, c = self.block, self.block.config
        q, cache = rotary_kernel(source_of(b.attn_q, x), source_of(b.attn_k, x), source_of(b.attn_v, x),
                                 *self.weights, self.eps, b.freqs_cis, b.cache_kv, start_pos,
                                 c.n_heads, c.head_dim, c.rope_dim, self.thread_groups, self.pooled)
        k, v = cache[0, :, :, 0:start_pos + 1, :], cache[1, :, :, 0:start_pos + 1, :]
        attn = q.reshape(1, c.n_heads, 1, c.head_dim).scaled_dot_product_attention(k, v, enable_gqa=True)
        return b.attn_output(attn.transpose(1, 2).reshape(B, T, -1))


def unfit(block) -> str | None:
    """Why a block's attention is not the one RotaryAttention computes (None: it is): tinygrad.llm's
    TransformerBlock's formula, its query and key norms over a head or none, no output gate, an even rope_dim
    no longer than a head, query heads a multiple of the key heads."""
    from tinygrad.llm.model import TransformerBlock
    if getattr(type(block), "_attention", None) is not TransformerBlock._attention:
        return "its attention is not tinygrad.llm's TransformerBlock's"
    c = block.config
    if c.qk_norm not in (0, c.head_dim):
        return f"its query and key norms span {c.qk_norm} values, not a head's {c.head_dim}"
    if c.attn_output_gate:
        return "its output is gated"
    if c.rope_dim % 2 or not 0 < c.rope_dim <= c.head_dim or c.n_heads % c.n_kv_heads:
        return f"rope over {c.rope_dim} of {c.head_dim} dimensions at {c.n_heads} query and {c.n_kv_heads} key heads"
    return None
