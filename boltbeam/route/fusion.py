"""Fusion: what folds into the generated layout's kernel, so that small kernels around it vanish.

A block norms its hidden state before its attention projections and before its gate and up, and the
model norms its last hidden state before the vocabulary projection; each RMS norm is a kernel or two a
token (its mean of squares, then the normed vector) that exist only for the products to read. With
`norm` on, every norm whose readers all run the layout's generated kernel is folded into them
(layout.Planes.kernel_product): they take the un-normed input and the norm's weight, sum the input's
squares group by group beside their own sums, and scale each row once. Which roles read which norm
is a fact of GGUF's tensor kinds (roles.NORM_READERS), never a model's names; a norm with a reader
that runs anything else (an expert table, a layer the layout kept in GGUF blocks, tensor code) is left
as it is, and the family counts it. Wherever a product is computed by tensor code (a prefill of
variable length), the norm runs first, as before.

With `rms` on, each RMS norm over the hidden state that is not folded (by NORM_READERS' kinds) runs
as one kernel generated at tinygrad's UOp level (norm_kernel) in place of tinygrad's two (the mean of
squares in one thread group of few threads, then the normed vector): one group of threads sums the
squares through local memory in two stages and writes the normed vector itself.

With `gated` on, a block's feed-forward, ffn_down(silu(gate(x)) * up(x)) as tinygrad.llm writes it,
takes the gate's and up's rows straight from the layout kernel's output (one product for a stack): the
activation and the up product are one kernel, where tinygrad.llm makes the activation contiguous first
(its own TODO) and a stack's product is copied before its rows are taken, three kernels in all.

With `inplace` on, a product of the generated kernel whose input is another generated kernel's output
(the attention's, where split attention runs its generated kernels) reads that output where it lies
(layout.in_place): tinygrad copies any view of a custom kernel's output before another custom kernel
reads it, one kernel a block.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields

from boltbeam.errors import BadInput
from boltbeam.measure.prepared import Prepared
from boltbeam.read.roles import NORM_READERS, norm_kind
from boltbeam.route.family import Family, Replaces, knobs, thread_group_limit
from boltbeam.route.layout import KERNEL_FORM, LayoutLinear, layers, module_at, stacks, taken_by_layout
from boltbeam.foresight.future import Calibration, Foreseen

LABEL = "fusion"                   # what it adds to a trace's route label
SPACE = "fusion"                   # its knobs and their values: data/spaces.toml


@dataclass(frozen=True)
class Fusion:
    norm: int = 0      # RMS norms folded into their readers' products
    gated: int = 0     # a feed-forward's activation and up product in one kernel
    rms: int = 0       # each RMS norm left as one generated kernel
    inplace: int = 0   # a product reads another generated kernel's output where it lies, uncopied

    def __post_init__(self):
        from boltbeam.foresight.space import check_knobs
        check_knobs(self, SPACE)
        if not any(getattr(self, f) for f in FIELDS):
            raise BadInput(f"fusion {asdict(self)}: folds nothing (the route without the family); turn on one of "
                           f"{', '.join(FIELDS)}")

    @property
    def flag(self) -> str:
        """The knobs that are on, joined by '+' (profile --fusion)."""
        return "+".join(f for f in FIELDS if getattr(self, f))

    @classmethod
    def parse(cls, flag: str) -> "Fusion":
        on = flag.split("+")
        if any(f not in FIELDS for f in on):
            raise BadInput(f"--fusion {flag}: expected what to fold, of {', '.join(FIELDS)} (joined by '+')")
        return cls(**{f: int(f in on) for f in FIELDS})

    def stored(self) -> dict[str, int]:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(Fusion))    # its knobs, in the flag's order
LATER = ("inplace",)      # knobs that came after the first route files: a route without them runs them off


class Normed:
    """A folded norm's stand-in in the model: the input goes on un-normed to the products that norm it.
    (tinygrad copies that input once for the kernel, which takes its inputs contiguous, where the block
    reads it elsewhere too: one copy in place of the norm's two kernels. Making it contiguous here
    instead adds copies.)"""
    def __call__(self, x):
        return x


class GatedFeedForward:
    """A block's feed-forward as tinygrad.llm's dense block computes it, ffn_down(silu(gate(x)) * up(x)),
    with gate's and up's rows read from their product uncopied, so the activation, the product with up
    and the down projection's input are one kernel. A prefill of variable length, whose products are
    tensor code, keeps the block's own (`original`)."""
    def __init__(self, block, original):
        self.block, self.original = block, original

    def __call__(self, x):
        if not all(isinstance(d, int) for d in x.shape):
            return self.original(x)
        b = self.block
        return b.ffn_down(b.ffn_gate.rows_of(x).silu() * b.ffn_up.rows_of(x))


def _dense_feed_forward(block) -> bool:
    """Whether the block's feed-forward is tinygrad.llm's dense one (the formula GatedFeedForward keeps)
    with gate and up in the layout's generated kernel."""
    from tinygrad.llm.model import FFNBlock
    return (getattr(type(block), "_feed_forward", None) is FFNBlock._feed_forward
            and not hasattr(block, "ffn_gate_exps") and hasattr(block, "ffn_down")
            and all(isinstance(getattr(block, n, None), LayoutLinear) and getattr(block, n).form == "kernel"
                    for n in ("ffn_gate", "ffn_up")))


GROUP_THREADS = (256, 64, 16, 4)     # a generated norm's group: the first that leaves each thread 2 or more


def group_threads(dim: int) -> int | None:
    """The generated norm's threads for a hidden size: a square dividing it at least twice (None: no such)."""
    return next((t for t in GROUP_THREADS if dim % t == 0 and dim // t >= 2), None)


def norm_kernel(x, weight, eps: float):
    """x (..., dim) with one row -> float32 x / sqrt(mean(x^2) + eps) * weight, as one kernel of one
    thread group: T threads (group_threads) each sum dim/T squares, the partials are summed through
    local memory in two stages of sqrt(T), and each thread writes its dim/T outputs."""
    from tinygrad import Tensor, UOp, dtypes
    from tinygrad.dtype import AddrSpace
    from tinygrad.uop.ops import AxisType, KernelInfo, Ops
    dim = x.shape[-1]
    T = group_threads(dim)
    per, fan = dim // T, math.isqrt(T)
    reduce = lambda n, axis: UOp.range(n, axis, AxisType.REDUCE)

    def kernel(Y, X, Wt):
        Y, X, Wt = Y.flatten(), X.flatten(), Wt.flatten()
        t = UOp.special(T, "lidx0")
        value = lambda i: X[i].cast(dtypes.float)
        k = reduce(per, 0)
        A = UOp.placeholder((T,), dtypes.float, 0, AddrSpace.LOCAL)[t].set(
            (value(t + k * T) * value(t + k * T)).reduce(k, arg=Ops.ADD))
        A = A.after(A.barrier())
        k2 = reduce(fan, 1)            # every thread sums a row of fan partials (threads 0..fan-1 the rows)
        R = UOp.placeholder((T,), dtypes.float, 1, AddrSpace.LOCAL)[t].set(
            A[(t % fan) * fan + k2].reduce(k2, arg=Ops.ADD))
        R = R.after(R.barrier())
        k3 = reduce(fan, 2)
        scale = (R[k3].reduce(k3, arg=Ops.ADD) * (1.0 / dim) + eps).sqrt().reciprocal()
        r = UOp.range(per, 3)
        i = t + r * T
        return Y[i].store(value(i) * scale * Wt[i].cast(dtypes.float)).end(r).sink(
            arg=KernelInfo(name=f"rms_norm_{dim}", opts_to_apply=()))

    y = Tensor.empty(dim, dtype=dtypes.float32, device=x.device)
    return Tensor.custom_kernel(y, x.reshape(dim), weight, fxn=kernel)[0].reshape(x.shape)


class GeneratedNorm:
    """An RMS norm as norm_kernel, where its input is one row of a fixed size (a decode step); elsewhere
    (a prefill of variable length) the model's own module."""
    def __init__(self, module):
        self.module, self.eps = module, float(module.eps)

    def __call__(self, x):
        if all(isinstance(d, int) for d in x.shape) and math.prod(x.shape[:-1]) == 1 and group_threads(x.shape[-1]):
            return norm_kernel(x, self.module.weight, self.eps)
        return self.module(x)


class Norm:
    """An RMS norm folded into products: its weight realized once as float32, its eps; called, it is the
    model's own norm (for tensor code that computes a product of the normed input)."""
    def __init__(self, module):
        self.module, self.eps = module, float(module.eps)
        self.weight = module.weight.float().contiguous().realize()

    def __call__(self, x):
        return self.module(x)


def install(net, census, model_path: str, fusion: Fusion) -> Prepared:
    """Fold every norm whose readers all run the layout's generated kernel into them (`norm`); fuse each
    dense feed-forward's activation and up product (`gated`); let every product read a generated kernel's
    output in place (`inplace`)."""
    t0 = time.perf_counter()
    prepared = Prepared(LABEL, asdict(fusion))
    if fusion.norm:
        _fold_norms(net, census, model_path, prepared)
    if fusion.rms:
        _generate_norms(net, census, model_path, prepared)
    if fusion.inplace:
        products = {id(m.planes): m.planes for m in layers(net, census) if m.form == "kernel"}
        if not products:
            raise BadInput(f"model {model_path}: --fusion inplace lets the layout's generated kernel read its input in "
                           f"place; no layer runs it (run with --layout SCALES:kernel[:stacked])")
        for p in products.values():
            p.reads_in_place = True
        prepared.eligible += len(products)
        prepared.applied += len(products)
        prepared.notes.append("a product reads its input in place where another generated kernel wrote it (the "
                              "attention's output, with split attention's generated kernels); the others as before")
    if fusion.gated:
        blocks = getattr(net, "blk", [])
        fused = [b for b in blocks if _dense_feed_forward(b)]
        if not fused:
            from tinygrad.llm.model import FFNBlock
            why = ("no block's feed-forward is tinygrad.llm's SiLU-gated formula (the file's architecture computes "
                   "another)" if blocks and all(getattr(type(b), "_feed_forward", None) is not FFNBlock._feed_forward
                                                for b in blocks)
                   else "no block has one (run with --layout SCALES:kernel[:stacked])")
            raise BadInput(f"model {model_path}: --fusion gated fuses a dense feed-forward whose gate and up run the "
                           f"layout's generated kernel; {why}")
        for b in fused:
            b._feed_forward = GatedFeedForward(b, b._feed_forward)
        prepared.eligible += len(blocks)
        prepared.applied += len(fused)
        if len(fused) < len(blocks):
            prepared.notes.append(f"{len(blocks) - len(fused)} of {len(blocks)} feed-forwards kept: not dense, or "
                                  f"their gate or up not in the layout's generated kernel")
    prepared.seconds = time.perf_counter() - t0
    return prepared


def _generate_norms(net, census, model_path: str, prepared: Prepared) -> None:
    """Every RMS norm of NORM_READERS' kinds still in the model (not folded) as a GeneratedNorm."""
    from tinygrad import nn
    most, threads = thread_group_limit("--fusion rms"), group_threads(census.facts.embedding) or 0
    if threads > most:
        raise BadInput(f"model {model_path}: --fusion rms needs {threads} threads a group; the device allows {most}")
    found = [module_at(net, t.name.removesuffix(".weight")) for t in census.tensors if norm_kind(t.name, t.block)]
    norms = [f for f in found if f is not None and isinstance(f[2], nn.RMSNorm)]
    if not norms:
        raise BadInput(f"model {model_path}: --fusion rms generates the hidden state's RMS norms; none is left here")
    for parent, attr, module in norms:
        setattr(parent, attr, GeneratedNorm(module))
    prepared.eligible += len(norms)
    prepared.applied += len(norms)


def _fold_norms(net, census, model_path: str, prepared: Prepared) -> None:
    from tinygrad import nn
    folded = eligible = 0
    for t in census.tensors:
        kind = norm_kind(t.name, t.block)
        found = module_at(net, t.name.removesuffix(".weight")) if kind is not None else None
        if found is None or not isinstance(found[2], nn.RMSNorm):
            continue
        eligible += 1
        readers = [r for r in census.tensors if r.block == t.block and r.role in NORM_READERS[kind]]
        layers = [module_at(net, "output" if r.tied else r.name.removesuffix(".weight")) for r in readers]
        layers = [m[2] for m in layers if m is not None]
        if not readers or len(layers) < len(readers) or not all(
                isinstance(m, LayoutLinear) and m.form == "kernel" for m in layers):
            continue
        norm = Norm(found[2])
        for m in layers:
            m.norm = norm
        parent, attr, _ = found
        setattr(parent, attr, Normed())
        folded += 1
        prepared.bytes += norm.weight.nbytes()
        prepared.placed[id(norm.weight.uop.base.buffer.base)] = (t,)
    if not folded:
        raise BadInput(f"model {model_path}: --fusion norm folds into the layout's generated kernel; no norm here has "
                       f"every reader run it (run with --layout SCALES:kernel[:stacked])")
    if folded < eligible:
        prepared.notes.append(f"{eligible - folded} of {eligible} norms kept: a reader "
                              f"of each does not run the layout's generated kernel")
    prepared.eligible += eligible
    prepared.applied += folded


# Kernels one generated norm adds to a token, net: on the H200 route (bench/h200/kernels/) 73 norms took 145
# of tinygrad's kernels away and brought 290 (the norms, 73 casts of their output, 144 residual sums).
RMS_KERNELS_ADDED = 2


def foresee(census, folded: Fusion, context: int, target, cal: Calibration, on) -> Foreseen:
    """The norms folded into the layout products of the route it goes on (`on`: its settings, a layout of the
    kernel form): each product that folds one reads the norm's weight (float32) beside its planes, and the
    norms launch no kernel of their own (a norm with a reader the layout does not take stays, and costs what
    it cost without the family). Its kernels are those it removes, counted negative: a fused feed-forward one
    a block whose gate and up the layout takes (the activation alone), and the stack's copy where they are
    stacked; the folded norms' are not counted (the input's copy replaces them). A generated norm adds
    RMS_KERNELS_ADDED: tinygrad's two kernels go, but a custom kernel's input and output are buffers of their
    own, so the elementwise work tinygrad fused into the norm's kernels and its readers (the residual sum it
    reads, the cast of its float32 output) runs as kernels beside it. Read in place, the attention's output
    loses its copy where the route runs split attention's generated kernels (one kernel a block whose output
    projection the layout takes)."""
    stack = on["layout"].stack == "stacked"
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
    if folded.inplace and getattr(on.get("split_attention"), "kernel", False):   # the attention's output, copied no more
        removed += sum(t.role == "attn_output" and taken_by_layout(t) for t in census.tensors)
    return Foreseen(nbytes, -removed, nbytes / target.bandwidth * 1e6,
                    ("bandwidth",) + (("kernels removed",) if removed > 0 else ("kernels added",) if removed else ()))


FAMILY = Family(SPACE, LABEL, "fusion", install=install, read=knobs(Fusion, later=LATER),
                of_values=lambda values: Fusion(**values), foresee=foresee, metavar="KNOB[+KNOB...]",
                parse=Fusion.parse, needs=KERNEL_FORM, admits=lambda values: any(values.values()),
                # the norms' kernels (folded or generated); the kernels gated and inplace remove are foresee's
                replaces=Replaces(regions=("norms",)),
                help="fold into the layout's generated kernel (needs --layout ...:kernel), knobs joined by '+': "
                     "`norm` folds each RMS norm whose every reader runs that kernel into those products; `gated` "
                     "makes a dense feed-forward's activation times up one kernel, reading gate and up from that "
                     "kernel's output uncopied; `rms` runs each RMS norm left as one generated kernel (needs thread "
                     "groups with local memory); `inplace` has a product read another generated kernel's output (the "
                     "attention's) where it lies, not a copy (spaces.toml, family fusion)")
