"""The gemv geometry: how the generated layout's word kernel spreads a product over the chip's threads.

The layout's kernel form (route/layout.py) reads packed values from planes. This family holds those
planes as 32-bit words (float32 views of the same bytes: tinygrad folds four float loads into one
16-byte load, which it does for no integer type) and gives each product the geometry of one setting
of spaces.toml's `gemv` family, as tinygrad's own opts on the kernel, never BEAM's:

  rows_per_group    output rows one thread group takes (LOCAL on the rows)
  lanes_per_row     threads that split one row's groups, combined in local memory (GROUP on the groups:
                    neighbouring threads read neighbouring groups, so their loads coalesce)
  rows_per_thread   rows one thread sums, reading each input value once for all of them (UPCAST)
  load_bytes        bytes of packed values one load takes: 4, 8 or 16 (UNROLL on a group's words; a
                    group holding fewer words takes them all)
  groups_per_step   consecutive groups a lane reads in one step (UNROLL on the groups): their loads in flight
                    together, before the lanes split the rest
  input_sums        1: the input's sum over each group (what a format's offset or zero point multiplies)
                    is computed once, by a kernel of its own, and read by every row; 0: every thread sums
                    the inputs of its groups itself, reading the input (32-bit values, eight times a 4-bit
                    weight's bytes) a second time through the cache
  unpack            how a value becomes a float: 0 by the compiler's integer-to-float conversion, after a
                    shift and a mask; 1 by placing its bits under a float's fixed exponent and taking that
                    power of two away (a mask, and one shift a word for its upper values, and a float
                    subtraction: fewer integer instructions a weight, none a conversion; exact)

A setting is one geometry for every product, or a geometry for each product (`PerProduct`, keyed by
the product's facts: rows, columns, bits a value, elements a group), as the search chooses by timing
each product alone (search/alone.py). A product whose rows or groups its geometry does not divide, or
that a per-product setting does not name, keeps the compiler's choice for its kernel, and the family
says how many did. Products are found by what they are (the layout's own layers in the kernel form),
never by a model's names.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import MISSING, asdict, dataclass, fields

from boltbeam.errors import BadInput
from boltbeam.measure.prepared import Prepared
from boltbeam.route.family import Family
from boltbeam.route.layout import (KERNEL_FORM, PRODUCTS, SCALE_BYTES, WORD_BITS, WRITTEN_BY, Planes, layers,
                                   layout_products)
from boltbeam.foresight.future import PER_KERNEL_FACT, Calibration, Foreseen, Work, predict
from boltbeam.units import DIGITS

LABEL = "gemv-geometry"            # what it adds to a trace's route label
SPACE = "gemv"                     # its knobs' values and rules: data/spaces.toml
MOST_UNROLLED = 32                 # tinygrad unrolls a range by at most this much


@dataclass(frozen=True)
class Geometry:
    lanes_per_row: int
    rows_per_group: int
    rows_per_thread: int
    load_bytes: int
    input_sums: int = 0
    groups_per_step: int = 1
    unpack: int = 0

    def __post_init__(self):
        from boltbeam.foresight.space import check_knobs
        check_knobs(self, SPACE)

    @property
    def flag(self) -> str:
        """LANES:ROWS:PER_THREAD:LOAD_BYTES[:INPUT_SUMS[:GROUPS_PER_STEP[:UNPACK]]], the trailing ones left out at
        their defaults (so a flag from before they existed reads the same)."""
        values = [getattr(self, f) for f in FIELDS]
        while len(values) > len(REQUIRED) and values[-1] == DEFAULTS[FIELDS[len(values) - 1]]:
            values.pop()
        return ":".join(map(str, values))

    @classmethod
    def parse(cls, flag: str) -> "Geometry":
        """LANES:ROWS:PER_THREAD:LOAD_BYTES[:INPUT_SUMS[:GROUPS_PER_STEP[:UNPACK]]] (profile --gemv)."""
        parts = flag.split(":")
        if not len(REQUIRED) <= len(parts) <= len(FIELDS) or not all(DIGITS.fullmatch(p) for p in parts):
            optional = "".join(f"[:{f.upper()}" for f in FIELDS[len(REQUIRED):]) + "]" * (len(FIELDS) - len(REQUIRED))
            raise BadInput(f"--gemv {flag}: expected {':'.join(f.upper() for f in REQUIRED)}{optional}, e.g. "
                           f"8:4:2:16, or PRODUCT=... for each product (ROWSxCOLS:qBITS:gGROUP=8:4:2:16,...)")
        return cls(*map(int, parts))

    @classmethod
    def from_knobs(cls, knobs, where: str, alternative: str = "") -> "Geometry":
        """A route file's knobs (those with a default may be left out)."""
        if not isinstance(knobs, dict) or not set(REQUIRED) <= set(knobs) <= set(FIELDS):
            raise BadInput(f"{where} {knobs}: expected the keys {', '.join(FIELDS)} (those after "
                           f"{REQUIRED[-1]} may be left out){alternative}")
        return cls(**knobs)

    def for_product(self, planes) -> "Geometry":
        return self

    def stored(self) -> dict[str, int]:
        return asdict(self)

    def words_per_load(self, planes) -> int:
        """Words of packed values one load takes: load_bytes, at most a group's."""
        return min(self.load_bytes // (WORD_BITS // 8), planes.group // planes.values_per_word)

    def divides(self, planes, n: int = 1) -> bool:
        """The setting fits this product's shape: one input row, rows and groups split whole."""
        return (n == 1 and planes.rows % (self.rows_per_group * self.rows_per_thread) == 0
                and (planes.cols // planes.group) % (self.lanes_per_row * self.groups_per_step) == 0)

    def sums_once(self, planes, n: int = 1) -> bool:
        """The word kernel reads the input's group sums, computed once, instead of summing them itself: where
        the setting asks for it and fits the shape (every format with a layout stores an offset or a zero
        point a group, which multiplies those sums: formats.toml, checked by the tests)."""
        return bool(self.input_sums) and self.divides(planes, n)

    def unpacks_by_exponent(self, planes, n: int = 1) -> bool:
        """The word kernel turns values into floats under a fixed exponent, not by conversion: where the
        setting asks for it and fits the shape."""
        return bool(self.unpack) and self.divides(planes, n)

    def opts(self, planes, n: int = 1, has_local: bool = True, squares: bool = False) -> tuple | None:
        """tinygrad's opts for the word kernel of these planes, or None where the setting does not fit the
        shape. Its ranges: rows; then the reductions: groups; a group's words and a word's values (the
        product); where the planes have an offset or a zero point and the kernel sums the input itself
        (not sums_once), a group's elements (the input's sum);
        with a norm folded in (`squares`), a group's elements again (the input's squares). Every value of
        a word is unrolled, a load's words unrolled and as many elements of each sum, then the groups a
        step, the rows a thread sums upcast, then the rows of a group and the lanes a row split the rows
        and the groups left (each lane a step's groups side by side with its neighbours'). A device
        without thread groups (a CPU) takes the loads, the groups a step and the rows a thread sums, not
        the threads."""
        from tinygrad.codegen.opt import Opt, OptOps
        if not self.divides(planes, n):
            return None
        per = planes.values_per_word
        # the kernel sums the input over a group too
        sums = (planes.offset is not None or bool(planes.zero)) and not self.sums_once(planes, n)
        # the reduce ranges tinygrad may unroll, in its order (by range id), with their sizes: an
        # UNROLL's axis is an index into this list, and a range unrolled whole leaves it
        sums_of_group = (["sum"] if sums else []) + (["squares"] if squares else [])
        unrollable = [["groups", planes.cols // planes.group], ["words", planes.group // per], ["values", per]] + [
            [name, planes.group] for name in sums_of_group]
        out = []

        def unroll(name: str, amount: int) -> None:
            if amount <= 1:
                return
            i = [r[0] for r in unrollable].index(name)
            whole = amount == unrollable[i][1]
            out.append(Opt(OptOps.UNROLL, i, 0 if whole else amount))   # 0: the whole range
            if whole:
                del unrollable[i]
            else:
                unrollable[i][1] //= amount
        unroll("values", per)
        unroll("words", self.words_per_load(planes))
        for name in sums_of_group:    # as many elements a step as one load of values covers
            unroll(name, min(MOST_UNROLLED, per * self.words_per_load(planes)))
        unroll("groups", self.groups_per_step)   # whole only with one lane a row (divides: lanes x step | groups)
        if self.rows_per_thread > 1:
            out.append(Opt(OptOps.UPCAST, 0, self.rows_per_thread))
        if has_local and self.rows_per_group > 1:
            out.append(Opt(OptOps.LOCAL, 0, self.rows_per_group))
        if has_local and self.lanes_per_row > 1:
            out.append(Opt(OptOps.GROUP, 0, self.lanes_per_row))    # the first reduce range: the groups
        return tuple(out)


FIELDS = tuple(f.name for f in fields(Geometry))    # its knobs, in the flag's order
DEFAULTS = {f.name: f.default for f in fields(Geometry) if f.default is not MISSING}
REQUIRED = tuple(f for f in FIELDS if f not in DEFAULTS)


def product_key(planes) -> str:
    """A product by its facts, as its word kernel's shape depends on them: ROWSxCOLS:qBITS:gGROUP."""
    return f"{planes.rows}x{planes.cols}:q{planes.bits}:g{planes.group}"


@dataclass(frozen=True)
class PerProduct:
    """A geometry for each product, by product_key; a product it does not name keeps the compiler's opts."""
    geometries: tuple[tuple[str, Geometry], ...]

    @property
    def flag(self) -> str:
        """PRODUCT=LANES:ROWS:PER_THREAD:LOAD_BYTES for each product, joined by ','."""
        return ",".join(f"{key}={g.flag}" for key, g in self.geometries)

    @classmethod
    def parse(cls, flag: str) -> "PerProduct":
        pairs = [part.split("=") for part in flag.split(",")]
        if any(len(p) != 2 or not re.fullmatch(KEY, p[0]) for p in pairs) or len({p[0] for p in pairs}) < len(pairs):
            raise BadInput(f"--gemv {flag}: expected PRODUCT=LANES:ROWS:PER_THREAD:LOAD_BYTES[:SUMS[:STEP[:UNPACK]]] once "
                           f"for each product, joined by ',' (PRODUCT as ROWSxCOLS:qBITS:gGROUP, "
                           f"e.g. 4096x4096:q4:g32=32:4:2:8)")
        return cls(tuple((key, Geometry.parse(g)) for key, g in pairs))

    @classmethod
    def from_table(cls, table: dict, where: str) -> "PerProduct":
        """A route file's table of product -> geometry knobs."""
        for key in table:
            if not re.fullmatch(KEY, key):
                raise BadInput(f"{where} {key}: expected a product (ROWSxCOLS:qBITS:gGROUP) and its geometry")
        return cls(tuple((key, Geometry.from_knobs(knobs, f"{where} product {key}:")) for key, knobs in table.items()))

    def for_product(self, planes) -> Geometry | None:
        return dict(self.geometries).get(product_key(planes))

    def stored(self) -> dict[str, dict[str, int]]:
        return {key: asdict(g) for key, g in self.geometries}


KEY = r"\d+x\d+:q\d+:g\d+"       # product_key's form


def parse(flag: str) -> Geometry | PerProduct:
    """The family's setting from profile --gemv: one geometry, or one for each product."""
    return PerProduct.parse(flag) if "=" in flag else Geometry.parse(flag)


def read(data, where: str) -> Geometry | PerProduct:
    """The family's setting from a route file's gemv table: a geometry's knobs, or a table of them for each product."""
    if not isinstance(data, dict):
        raise BadInput(f"{where} must be a table ({', '.join(FIELDS)}), or one for each product, or null")
    if data and all(isinstance(v, dict) for v in data.values()):
        return PerProduct.from_table(data, where)
    return Geometry.from_knobs(data, where, ", or a product (ROWSxCOLS:qBITS:gGROUP) for each")


def install(net, census, model_path: str, geometry: Geometry | PerProduct) -> Prepared:
    """Turn the planes of every kernel-form layout layer into words and give their kernel its geometry."""
    import time

    from tinygrad import Device

    t0 = time.perf_counter()
    kernel = [m for m in layers(net, census) if m.form == "kernel"]
    if not kernel:
        raise BadInput(f"model {model_path}: --gemv shapes the layout's generated kernel; run it with --layout "
                       f"SCALES:kernel[:stacked] (no layer runs the kernel form)")
    planes = {id(m.planes): m for m in kernel}
    settings = asdict(geometry) if isinstance(geometry, Geometry) else {"per_product": geometry.flag}
    prepared = Prepared(LABEL, settings, eligible=len(planes))
    for m in planes.values():
        p = m.planes
        p.to_words()
        p.geometry, p.thread_groups = geometry.for_product(p), Device[p.low.device].renderer.has_local
        prepared.applied += p.geometry is not None and p.geometry.divides(p)
        prepared.bytes += p.nbytes
        for t in (p.low, p.high):
            if t is not None:
                prepared.placed[id(t.uop.base.buffer.base)] = m.entries
    if prepared.applied < prepared.eligible:
        prepared.notes.append(f"{prepared.eligible - prepared.applied} of {prepared.eligible} products: rows or groups "
                              f"their geometry does not divide, or no geometry named; their kernels keep the "
                              f"compiler's choice")
    prepared.seconds = time.perf_counter() - t0
    return prepared


def geometry_sight(p: Planes, nbytes: int, geometry: Geometry, target, cal: Calibration):
    """FutureSight on one product of `nbytes` at a geometry, or None where the geometry does not divide
    its shape: Little's law at the geometry's threads, each keeping one load of `load_bytes` (at most a
    group's) in flight for each row it sums and each group of a step; computing the input's group sums
    once adds a kernel."""
    if not geometry.divides(p):
        return None
    word = dataclasses.replace(cal, bytes_in_flight_per_thread=WORD_BITS // 8, unroll_adds_in_flight=True)
    sight = predict(Work(nbytes, 2 * p.rows * p.cols, p.rows),
                    {"local": geometry.rows_per_group, "group": geometry.lanes_per_row, "upcast": geometry.rows_per_thread,
                     "unroll": geometry.words_per_load(p) * geometry.rows_per_thread * geometry.groups_per_step},
                    target, word)
    if geometry.sums_once(p):
        # The input's group sums run as a kernel of their own: one more kernel at the target's measured cost.
        # What they save (the input read once a group, not again in every thread) is read from the cache,
        # which this model does not see.
        sight.us += (target.fact(PER_KERNEL_FACT) or 0.0) * 1e6
        sight.terms.append("one more kernel")
    return sight


def foresee(census, geometry: Geometry, context: int, target, cal: Calibration, on) -> Foreseen:
    """Each product of the layout it goes on (`on`: the route's settings, a layout of the kernel form) at the
    geometry (geometry_sight); a product the geometry does not divide at the fraction of the bandwidth the
    compiler's choices for generated kernels were measured to reach."""
    setting = on["layout"]
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


FAMILY = Family(SPACE, LABEL, "gemv", install=install, read=read, of_values=lambda values: Geometry(**values),
                foresee=foresee, metavar="LANES:ROWS:PER_THREAD:LOAD_BYTES[:SUMS[:STEP[:UNPACK]]]", parse=parse,
                needs=KERNEL_FORM, replaces=PRODUCTS,
                help="the geometry of the layout's generated kernel (needs --layout ...:kernel): threads a row, rows "
                     "a thread group, rows a thread, bytes a load; 1 to compute the input's group sums once (default "
                     "0); groups a lane reads in one step (default 1); 1 to unpack values under a float's exponent "
                     "(default 0); its planes held as 32-bit words (spaces.toml, family gemv); or one for each "
                     "product, ROWSxCOLS:qBITS:gGROUP=L:R:T:B joined by ',' (a product not named keeps the "
                     "compiler's opts)")
