"""Each product of a route's layout timed alone on the device at the gemv family's geometries: what the
search measures before it judges a geometry for each product on the whole token (search/choose.py).

A product is known by its facts (rows, columns, bits a value, elements a group, whether its format stores
a minimum a group: an offset plane, or a zero point), never by a model's names; random planes of those facts are
made on the device (never zeros). At each geometry the word kernel's product is first checked against
the planes' weights times a random input (tensor code); only a geometry that computes that product is
timed, as tinygrad's BEAM times a kernel (its own `_time_program`, the caches emptied before each run
where the device can), on scratch buffers of the kernel's sizes filled with random bytes; a geometry that
computes the input's group sums once is timed with that kernel's time added. Geometries go in
FutureSight's order (equal predictions in a seeded random order), `most` at most a product and no new
one after `seconds` of the product's own; a product's choice is its fastest. Where an earlier search's
times alone are given (earlier_times), up to half of a product's `most` go first to the geometries that
search found fastest there, timed again (another session, another machine), and the rest explore in
FutureSight's order. Nothing here decides the route: the whole token does.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Callable

import numpy as np

from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput
from boltbeam.measure import programs
from boltbeam.measure.route import with_opts
from boltbeam.route.gemv import Geometry, geometry_sight, product_key
from boltbeam.route.layout import Planes, Setting, taken_groups, values_of
from boltbeam.foresight.future import Calibration, rank_correlation
from boltbeam.search.compiler import compile_pool, compile_workers, compiled_in_order

CHECK = 1e-4      # a geometry's product against the planes' weights times the input, relative to its largest
REPS = 20         # timed runs of each geometry


@dataclass(frozen=True)
class Shape:
    """A product's facts: what its word kernel's shape and sums depend on."""
    rows: int
    cols: int
    bits: int
    group: int
    offset: bool      # an offset a group (formats.toml values.offset); else a zero point, half the values' range

    def planes(self) -> Planes:
        """Planes of these facts without tensors (for FutureSight and the key)."""
        return Planes(self.rows, self.cols, self.bits, self.group, None, None, None, None, self.zero)

    @property
    def zero(self) -> int:
        return 0 if self.offset else 1 << (self.bits - 1)


@dataclass
class Timed:
    """One geometry of one product: FutureSight's prediction and the times alone (or why none)."""
    geometry: str
    predicted_us: float
    median_us: float | None = None
    samples_us: list[float] | None = None
    kernels_us: list[float] | None = None      # each kernel's median alone, the generated one first
    refused: str | None = None
    relative_error: float | None = None


@dataclass
class Product:
    """One product shape of the token: how many the token runs, its bytes, its geometries as timed."""
    key: str
    count: int
    bytes: int
    legal: int                                   # geometries that divide its shape
    timed: list[Timed] = field(default_factory=list)
    from_earlier: int = 0                        # of timed: the first ones, an earlier search's fastest
    best: str | None = None
    best_us: float | None = None
    spearman: float | None = None                # FutureSight's order against the times
    seconds: float = 0.0


def shapes(census, setting: Setting) -> Counter:
    """The products one token runs with the layout, by shape, counted (layout_products in route/layout.py, with
    whether each format stores an offset a group)."""
    counts: Counter = Counter()
    for group in taken_groups(census, setting):
        v = values_of(group[0].format)
        counts[Shape(sum(t.shape[1] for t in group), group[0].shape[0], v.bits, v.group, v.offset)] += 1
    return counts


def random_planes(shape: Shape, scale_dtype: str, rng) -> Planes:
    """Realized planes of the shape's facts holding random bytes, their scales (and offsets) small."""
    from tinygrad import Tensor
    rows, cols = shape.rows, shape.cols
    u8 = lambda n: Tensor(rng.integers(0, 256, (rows, n), dtype=np.uint8))
    small = lambda: Tensor(rng.uniform(-1e-2, 1e-2, (rows, cols // shape.group)).astype(scale_dtype))
    p = Planes(rows, cols, shape.bits, shape.group, u8(cols if shape.bits == 8 else cols // 2),
               u8(cols * (shape.bits - 4) // 8) if 4 < shape.bits < 8 else None, small(),
               small() if shape.offset else None, shape.zero)
    Tensor.realize(*p.tensors())
    return p


def kernel_asts(p: Planes, x) -> tuple:
    """The ASTs of the kernels the planes' product on input x runs, as tinygrad schedules them (nothing
    runs): the generated kernel first, then any other (the input's group sums, where the geometry computes
    them once)."""
    from tinygrad.uop.ops import Ops
    p.memo = None
    sinks = [c.src[0] for c in p.kernel_product(x).linear_with_vars()[0].src if c.src[0].op is Ops.SINK]
    return tuple(sorted(sinks, key=lambda a: not (a.arg is not None and a.arg.name.startswith("gemv"))))


def time_alone(asts: tuple, opts: tuple | None, reps: int, rng, scratch: dict | None = None) -> list[list[float]] | str:
    """The product's kernels alone on the device, the generated one at these opts and any other at the
    compiler's own, each reps times on buffers of random bytes (µs, a list for each kernel), or why one
    could not run (the search's own compile and timing, search/compiler.py). The buffers are made once for
    each kernel and kept in `scratch` where it is given, for the product's next geometry (the vocabulary's
    planes are half a gigabyte of random bytes). Each kernel alone pays its own launch, which a token's graph
    mostly hides: a product of two kernels pays it twice here."""
    from tinygrad import Device

    from boltbeam.search.compiler import compile_ast, scratch_buffers, time_ast
    ren = Device[Device.DEFAULT].renderer
    scratch = {} if scratch is None else scratch
    out = []
    for i, ast in enumerate(asts):
        prg = compile_ast(ast, ren, None if opts is None or i else tuple(opts))
        if isinstance(prg, str):
            return prg
        if ast.key not in scratch:
            scratch[ast.key] = scratch_buffers(ast, ren.target.device, rng.bytes)
        samples = time_ast(ast, ren, prg, reps, scratch[ast.key])
        if isinstance(samples, str):
            return samples
        out.append(samples)
    return out


def earlier_times(path: str) -> dict[str, list[Geometry]]:
    """An earlier gemv search's summary (its search.json): each product's geometries timed alone there,
    fastest first; one line on anything else."""
    from boltbeam.files import load_json
    doc = load_json(path, "search summary")
    products = doc.get("alone") if isinstance(doc, dict) else None
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    if not isinstance(products, list) or not products or not all(
            isinstance(p, dict) and isinstance(p.get("key"), str) and isinstance(p.get("timed"), list) and
            all(isinstance(r, dict) and isinstance(r.get("geometry"), str) for r in p["timed"]) for p in products):
        raise BadInput(f"{path}: not a summary of products timed alone (`search --family gemv --alone K` writes one)")
    out = {}
    for p in products:
        done = sorted((r for r in p["timed"] if number(r.get("median_us"))), key=lambda r: r["median_us"])
        try:
            out[p["key"]] = [Geometry.parse(r["geometry"]) for r in done]
        except BadInput as e:
            raise BadInput(f"{path}: product {p['key']}: {e}") from None
    return out


def time_product(shape: Shape, count: int, scale_dtype: str, geometries: list[Geometry], target: Target,
                 cal: Calibration, most: int, seconds: float, rng, reps: int = REPS,
                 earlier: list[Geometry] = (), pool=None) -> Product:
    """The product's legal geometries, each checked then timed alone, until `most` were timed or `seconds`
    passed: first (up to half of `most`) those of `earlier`, an earlier search's fastest first, that are
    legal here; then FutureSight's order. Its fastest is its choice. With a compile pool
    (search/compiler.py's compile_pool), the geometries' kernels are compiled there, ahead of their turn."""
    from tinygrad import Device, Tensor

    t0 = time.monotonic()
    p = random_planes(shape, scale_dtype, rng)
    x = Tensor(rng.standard_normal((1, shape.cols)).astype(np.float32)).realize()
    want = (x @ p.weights().T).numpy().ravel()
    p.to_words()
    sights = {g: s for g in geometries if (s := geometry_sight(p, p.nbytes, g, target, cal)) is not None}
    out = Product(product_key(p), count, p.nbytes, len(sights))
    groups = Device[Device.DEFAULT].renderer.has_local
    # FutureSight predicts many geometries alike (at the bandwidth floor): among equal predictions it has no
    # order, so they go in a random one (seeded), and `most` samples them across the space, not one corner
    tie = dict(zip(geometries, rng.permutation(len(geometries)).tolist()))
    first = list(dict.fromkeys(g for g in earlier if g in sights))[:most // 2]
    taken = set(first)
    rest = [g for g in sorted(sights, key=lambda g: (sights[g].us, tie[g])) if g not in taken]
    todo = (first + rest)[:most]
    kind = lambda g: (g.sums_once(p), g.unpacks_by_exponent(p))
    asts = {}     # the product's kernels, by whether the geometry computes the input's group sums once and unpacks by exponent
    for g in todo:
        if kind(g) not in asts:
            p.geometry, p.thread_groups = g, groups
            asts[kind(g)] = kernel_asts(p, x)
    # each geometry's generated kernel, compiled ahead by the pool while the earlier ones are checked and timed
    opts = {g: g.opts(p, 1, groups) for g in todo}
    generated = {g: with_opts(asts[kind(g)][0], opts[g]) for g in todo}
    ready: dict = {}
    scratch: dict = {}      # each kernel's buffers of random bytes, made for its first geometry
    ahead = compiled_in_order([(generated[g], Device[Device.DEFAULT].renderer, None) for g in todo], pool)
    with programs.given(ready):
        for g in todo:
            if time.monotonic() - t0 > seconds:
                break
            row = Timed(g.flag, sights[g].us)
            out.timed.append(row)
            if isinstance(program := next(ahead), str):
                row.refused = program
                continue
            ready[generated[g].key] = program
            p.geometry, p.thread_groups, p.memo = g, groups, None
            got = p.gemv(x, "kernel").numpy().ravel()
            row.relative_error = err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            samples = time_alone(asts[kind(g)], opts[g], reps, rng, scratch) if err <= CHECK else \
                f"wrong product: relative error {err:.3g}"
            if isinstance(samples, list):     # the product's time: its kernels' summed run by run
                row.samples_us = [sum(run) for run in zip(*samples)]
                row.median_us, row.kernels_us = median(row.samples_us), [median(k) for k in samples]
            else:
                row.refused = samples
    out.from_earlier = min(len(first), len(out.timed))     # out of time sooner: only those it reached
    ok = [r for r in out.timed if r.median_us is not None]
    if ok:
        best = min(ok, key=lambda r: r.median_us)
        out.best, out.best_us = best.geometry, best.median_us
        out.spearman = rank_correlation([r.predicted_us for r in ok], [r.median_us for r in ok])
    out.seconds = round(time.monotonic() - t0, 2)
    return out


def time_products(census, setting: Setting, geometries: list[Geometry], target: Target, cal: Calibration,
                  most: int, seconds: float, say: Callable[[str], None] = lambda s: None,
                  earlier: dict[str, list[Geometry]] | None = None) -> list[Product]:
    """Every product shape of the layout, timed alone at its geometries (time_product; an earlier search's
    fastest first, by product, where `earlier` is given), biggest first; their kernels compiled by as many
    processes beside this one as tinygrad's BEAM would start (compile_workers)."""
    from tinygrad import Device
    rng = np.random.default_rng(0)
    counted = sorted(shapes(census, setting).items(), key=lambda kv: -kv[0].rows * kv[0].cols * kv[0].bits)
    out = []
    with compile_pool(compile_workers(Device.DEFAULT)) as pool:
        for shape, count in counted:
            say(f"timing geometries alone: {product_key(shape.planes())}")
            out.append(time_product(shape, count, setting.scale_dtype, geometries, target, cal, most, seconds, rng,
                                    earlier=(earlier or {}).get(product_key(shape.planes()), ()), pool=pool))
    return out
