"""Layout at load: a GGUF weight's blocks repacked once, on the device, with tinygrad, into planes.

GGML blocks interleave values and scales in odd-sized records (Q6_K's is 210 bytes), so a kernel
reading them cannot use wide aligned loads and decodes packed scale fields for every element. The
repacked layout splits one matrix into row-major planes: the values' low 4 bits two per byte, their
high bits (a 5- or 6-bit format) packed beside, and one scale and one offset per group of elements
(or a single zero point when every group's offset is a whole multiple of its scale).

It is generated from four facts per format in formats.toml (`values`: bits, group, signed, the byte
fields holding values; a fifth, offset, says which kind of planes to expect before any is built),
never written per format: tinygrad's own decoder (`ggml_data_to_tensor`, the default route's math)
decodes the blocks as they are, with their value bytes zeroed (each group's offset, read at the
group's first element) and with every value set to one (offset + scale); each value is then
round((weight - offset) / scale). A format tinygrad decodes and
formats.toml describes gets the layout; a wrong group size shows up as a mismatch at load.

`Setting` is the family's knobs: the scales' data type, the gemv's form and the stack. "expanded"
decodes each weight and multiplies; "factored" sums value x activation per group, then scales the
group once (tensor code: tinygrad makes two kernels of it); "kernel" is the factored product as one
kernel written at tinygrad's UOp level from the planes' description (bits, group, zero point), both
reductions nested in it, its opts left to tinygrad's heuristics or BEAM like any other kernel.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from boltbeam.bound.roofline import formats
from boltbeam.errors import BadInput
from boltbeam.measure.route import LAYOUT_LABEL
from boltbeam.measure.prepared import Prepared
from boltbeam.read.roles import REGIONS, SHARED_INPUT
from boltbeam.route import planes_cache
from boltbeam.route.family import Family, Needs, Replaces, knobs
from boltbeam.foresight.future import Calibration, Foreseen

SCALE_BYTES = {"float16": 2, "float32": 4}
FORMS = ("expanded", "factored", "kernel")   # the family's `form` parameter: 0, 1, 2
STACKS = ("separate", "stacked")        # its `stacked` parameter: 0, 1
SPACE = "repacked_layout"              # its knobs and their values: data/spaces.toml
WORD_BITS = 32                          # the word kernel's load: one 32-bit word of packed values
MANTISSA_BITS, FLOAT_BIAS = 23, 127      # a float32's stored mantissa bits and its exponent's bias


def _reduce(size: int, axis: int):
    from tinygrad import UOp
    from tinygrad.uop.ops import AxisType
    return UOp.range(size, axis, AxisType.REDUCE)


def upper_shift(width: int, bits: int) -> int:
    """The one right shift that brings every value of a word whose bits would reach a float's exponent field
    (at WIDTH bits a value, BITS wide with its high bits) below it: the least multiple of the width at least
    the overhang of the word's last value."""
    overhang = WORD_BITS - width + bits - MANTISSA_BITS
    return -(-overhang // width) * width


@dataclass(frozen=True)
class Values:
    """How a format stores its values (formats.toml `values`)."""
    bits: int
    group: int
    signed: bool
    fields: tuple[tuple[int, int, int], ...]   # (start, end, the byte that stores value 1)
    offset: bool = True                         # a minimum a group; else a zero point (half the range)


@dataclass(frozen=True)
class Setting:
    """One setting of the repacked-layout family."""
    scale_dtype: str = "float16"
    form: str = "expanded"
    stack: str = "separate"

    def __post_init__(self):
        from boltbeam.foresight.space import families
        space = families()[SPACE].parameters
        dtypes = [d for d, b in SCALE_BYTES.items() if b in space["scale_bytes"]]
        forms = [f for i, f in enumerate(FORMS) if i in space["form"]]
        stacks = [s for i, s in enumerate(STACKS) if i in space["stacked"]]
        if self.scale_dtype not in dtypes or self.form not in forms or self.stack not in stacks:
            raise BadInput(f"layout setting {self.flag}: scale_dtype must be one of {', '.join(dtypes)}, form one of "
                           f"{', '.join(forms)}, stack one of {', '.join(stacks)} (spaces.toml, family {SPACE})")

    @property
    def flag(self) -> str:
        """SCALES:FORM, with :stacked when the stack is on (profile --layout)."""
        return f"{self.scale_dtype}:{self.form}" + ("" if self.stack == STACKS[0] else f":{self.stack}")

    @classmethod
    def parse(cls, flag: str) -> "Setting":
        parts = flag.split(":")
        if len(parts) not in (2, 3):
            raise BadInput(f"--layout {flag!r}: expected SCALES:FORM[:stacked], e.g. float16:expanded")
        return cls(*parts)

    @classmethod
    def of_values(cls, values: dict[str, int]) -> "Setting":
        """A setting from its parameters' values in spaces.toml (scale bytes, the form's and the stack's places)."""
        by_bytes = {b: d for d, b in SCALE_BYTES.items()}
        return cls(by_bytes[values["scale_bytes"]], FORMS[values["form"]], STACKS[values["stacked"]])

    def stored(self) -> dict[str, str]:
        return asdict(self)


def values_of(fmt: str) -> Values | None:
    """The format's value description, or None when the layout family cannot repack it."""
    v = formats().get(fmt, {}).get("values")
    if v is None:
        return None
    return Values(int(v["bits"]), int(v["group"]), bool(v["signed"]), tuple(tuple(int(x) for x in f) for f in v["fields"]),
                  bool(v.get("offset", True)))


def formats_with_layout() -> list[str]:
    return [name for name, f in formats().items() if "values" in f]


def _patterns(values: Values, block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per block byte: 1 where it is kept (not a value byte), and the byte that stores value 1."""
    keep, one = np.ones(block_bytes, np.uint8), np.zeros(block_bytes, np.uint8)
    for start, end, byte in values.fields:
        keep[start:end], one[start:end] = 0, byte
    return keep, one


@dataclass
class Planes:
    """One weight matrix (rows x cols) in the repacked layout, as lazy or realized tinygrad tensors."""
    rows: int
    cols: int
    bits: int
    group: int
    low: Any             # uint8 (rows, cols/2): two 4-bit values per byte; (rows, cols) when bits == 8
    high: Any | None     # uint8 (rows, cols*(bits-4)/8): the high bits of 5- and 6-bit values
    scale: Any           # (rows, cols/group)
    offset: Any | None   # (rows, cols/group), or None: every offset is -zero x scale
    zero: int = 0
    # low and high held as 32-bit words (float32 views of the same bytes, so tinygrad loads four at once),
    # the geometry the word kernel takes for one input row (route/gemv.py's; None: the compiler's opts),
    # and whether their device runs thread groups (read at install: no device is asked inside a capture)
    words: bool = False
    geometry: Any | None = None
    thread_groups: bool = False
    # whether the generated kernel reads an input that another generated kernel wrote where it lies (in_place)
    reads_in_place: bool = False
    # The generated kernel's last (input, product): the layers of a stack ask for the same product,
    # and a custom kernel's fresh output buffer keeps tinygrad from merging the identical requests.
    memo: Any = field(default=None, repr=False, compare=False)

    def tensors(self) -> list:
        return [t for t in (self.low, self.high, self.scale, self.offset) if t is not None]

    @property
    def values_per_word(self) -> int:
        """Values one 32-bit word of the low plane holds: four 8-bit ones, or eight low 4-bit parts."""
        return WORD_BITS // (8 if self.bits == 8 else 4)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.tensors())

    def to_words(self) -> None:
        """Hold low and high as 32-bit words, realized: the same bytes, read four at a time."""
        from tinygrad import Tensor, dtypes
        if self.words:
            return
        self.low, self.high = (None if t is None else t.bitcast(dtypes.float32).contiguous() for t in (self.low, self.high))
        Tensor.realize(*self.tensors())
        self.words, self.memo = True, None

    def _bytes(self, t):
        from tinygrad import dtypes
        return t.bitcast(dtypes.uint8) if self.words else t

    def values(self):
        """(rows, cols) unsigned values as float32."""
        from tinygrad import dtypes
        low = self._bytes(self.low)
        if self.bits == 8:
            return low.cast(dtypes.float32)
        u = _unpack(low, 4).reshape(self.rows, self.cols)
        if self.high is not None:
            u = u.bitwise_or(_unpack(self._bytes(self.high), self.bits - 4).reshape(self.rows, self.cols).lshift(4))
        return u.cast(dtypes.float32)

    def _grouped(self, t):
        return t.reshape(self.rows, self.cols // self.group, self.group)

    def weights(self):
        """(rows, cols) float32 weights: scale x (value - zero) + offset."""
        from tinygrad import dtypes
        s = self.scale.cast(dtypes.float32).unsqueeze(-1)
        w = (self._grouped(self.values()) - self.zero) * s
        if self.offset is not None:
            w = w + self.offset.cast(dtypes.float32).unsqueeze(-1)
        return w.reshape(self.rows, self.cols)

    def gemv(self, x, form: str, norm=None):
        """x (..., cols) float -> (..., rows): the weight's product, in the setting's form; with `norm` (an
        RMS norm module), the product of the normed input: inside the generated kernel, or by the norm
        itself first wherever tensor code computes the product."""
        from tinygrad import dtypes
        variable = not all(isinstance(d, int) for d in x.shape)    # a prefill of variable length
        if norm is not None and (form != "kernel" or variable):
            x = norm(x)
        if form == "expanded" or form == "kernel" and variable:      # (a custom kernel takes no variable shape)
            return x.matmul(self.weights().T)
        if form == "kernel":
            flat = x.reshape(-1, self.cols)
            if self.memo is None or self.memo[0] is not flat.uop or self.memo[1] is not norm:
                self.memo = flat.uop, norm, self.kernel_product(flat, norm)
            return self.memo[2].reshape(*x.shape[:-1], self.rows)
        g = self.cols // self.group
        xg = x.reshape(*x.shape[:-1], 1, g, self.group)                       # (..., 1, G, group)
        inner = (self._grouped(self.values()) * xg).sum(-1)                  # (..., rows, G)
        s = self.scale.cast(dtypes.float32)
        y = (inner * s).sum(-1)
        xsum = xg.sum(-1)                                                    # (..., 1, G)
        y = y - self.zero * (xsum * s).sum(-1) if self.zero else y
        if self.offset is not None:
            y = y + (xsum * self.offset.cast(dtypes.float32)).sum(-1)
        return y

    def kernel_product(self, x, norm=None):
        """x (n, cols) -> (n, rows) float32: the factored product as one kernel written at tinygrad's UOp
        level from the planes' description (bits, group, zero point): each group's values times the
        input summed, then scaled once, and the input's sum per group times the offset (or the zero
        point), both reductions nested in one kernel. Byte planes: its opts are tinygrad's heuristics'
        or BEAM's. Word planes: each value is shifted out of a 32-bit word, and the geometry, where it
        divides the shape, sets the opts (route/gemv.py); a geometry with input_sums reads each group's sum
        of the input from a small kernel run before it, instead of summing the group in every thread.

        With `norm` (an RMS norm module: weight w, eps) the kernel takes the un-normed input and folds
        the norm in: the input times w in both sums, and beside them each group's sum of the input's
        squares, reduced over the groups with the product, so the row's result is multiplied once by
        1 / sqrt(mean of squares + eps). The norm's own kernels are then not needed."""
        from tinygrad import Tensor, dtypes
        n = x.shape[0]
        exponent = self.words and self.geometry is not None and self.geometry.unpacks_by_exponent(self, n)
        # the input's group sums computed once, by tensor code (a kernel of its own), where the geometry asks
        once = (self.words and self.geometry is not None and self.geometry.sums_once(self, n)
                and (self.offset is not None or bool(self.zero)))
        group_sums = []
        if once:
            xw = x.float() * norm.weight.float() if norm is not None else x.float()
            group_sums = [xw.reshape(n, self.cols // self.group, self.group).sum(-1)]
        y = Tensor.empty(n, self.rows, dtype=dtypes.float32, device=self.low.device)
        source = in_place(x, dtypes.float32) if self.reads_in_place else None
        ins = [x.float() if source is None else source, self.low, *([self.high] if self.high is not None else []), self.scale,
               *([self.offset] if self.offset is not None else []), *([norm.weight] if norm is not None else []), *group_sums]
        return Tensor.custom_kernel(y, *ins, fxn=functools.partial(self._product, n, norm, once, exponent))[0]

    def _product(self, n: int, norm, once: bool, exponent: bool, y, x, low, *rest):
        """kernel_product's kernel: y (n, rows) from the input x (n x cols, or the generated kernel's output that
        holds them in order), the planes (low, then high, scale, offset where the planes hold them), the norm's
        weight (with `norm`) and the input's group sums (`once`); `exponent`: word values unpacked under a
        float's exponent (_exponent_unpack)."""
        from tinygrad import UOp, dtypes
        from tinygrad.uop.ops import KernelInfo, Ops
        x = x.flatten()
        high = rest[0] if self.high is not None else None
        scale = rest[1 if self.high is not None else 0]
        offset = rest[2 if self.high is not None else 1] if self.offset is not None else None
        weight = rest[-2 if once else -1] if norm is not None else None
        sums = rest[-1] if once else None
        b, r = UOp.range(n, 0), UOp.range(self.rows, 1)
        g = _reduce(self.cols // self.group, 2)
        xin = (lambda c: x[b * self.cols + c] * weight[c].cast(dtypes.float)) if norm is not None else (
            lambda c: x[b * self.cols + c])
        v, c, inner_ranges = self._word_value(low, high, r, g, exponent) if self.words else self._byte_value(low, high, r, g)
        inner = (v * xin(c)).reduce(*inner_ranges, arg=Ops.ADD)
        s = scale[r, g].cast(dtypes.float)
        term = inner * s
        if offset is not None or self.zero:
            # the input's sum over the group: read where it was computed once (sums), else summed here;
            # word planes give it a range of its own (one, the group's elements), since tinygrad's opts
            # split a range in one reduction only and the geometry's opts must reach both
            i = _reduce(self.group, 5) if self.words and sums is None else None
            xsum = (sums[b, g] if sums is not None else xin(g * self.group + i).reduce(i, arg=Ops.ADD)
                    if self.words else xin(c).reduce(*inner_ranges, arg=Ops.ADD))
            term = term + xsum * (offset[r, g].cast(dtypes.float) if offset is not None else -self.zero * s)
        out = term.reduce(g, arg=Ops.ADD)
        if norm is not None:
            k = _reduce(self.group, 6)
            at = b * self.cols + g * self.group + k
            squares = (x[at] * x[at]).reduce(k, arg=Ops.ADD).reduce(g, arg=Ops.ADD)
            out = out * (squares * (1.0 / self.cols) + norm.eps).sqrt().reciprocal()
        opts = None
        if self.words and self.geometry is not None:
            opts = self.geometry.opts(self, n, self.thread_groups, squares=norm is not None)
        name = f"gemv_{'words' if self.words else 'planes'}_{self.bits}" + ("_normed" if norm is not None else "")
        return y[b, r].store(out).end(b, r).sink(arg=KernelInfo(name=name, opts_to_apply=opts))

    def _byte_value(self, low, high, r, g):
        """The unsigned values of a group, one byte read per value: (value, column, the reduction's ranges)."""
        from tinygrad import dtypes
        high_width = self.bits - 4
        i = _reduce(self.group, 3)
        c = g * self.group + i
        if self.bits == 8:
            return low[r, c].cast(dtypes.float), c, (i,)
        v = (low[r, c // 2].cast(dtypes.int) >> ((c % 2) * 4)) & 15
        if high is not None:
            per = 8 // high_width
            v = v | (((high[r, c // per].cast(dtypes.int) >> ((c % per) * high_width)) & ((1 << high_width) - 1)) << 4)
        return v.cast(dtypes.float), c, (i,)

    def _word_value(self, low, high, r, g, exponent: bool):
        """The same values from 32-bit words: word w of the group, value j of the word (j the inner reduction),
        each converted to a float by the compiler's conversion, or, where the geometry asks (`exponent`),
        placed under a float's fixed exponent (_exponent_unpack)."""
        from tinygrad import dtypes
        per, high_width = self.values_per_word, self.bits - 4
        w, j = _reduce(self.group // per, 3), _reduce(per, 4)
        word = low[r, g * (self.group // per) + w].bitcast(dtypes.uint)
        high_word = bit = None
        if high is not None:     # a group's high bits fill whole words (group x high width is a multiple of 32)
            bit = (w * per + j) * high_width
            high_word = high[r, g * (self.group * high_width // WORD_BITS) + bit // WORD_BITS].bitcast(dtypes.uint)
        if exponent:
            return self._exponent_unpack(word, j, high_word, bit), g * self.group + w * per + j, (j, w)
        v = (word >> (j * (WORD_BITS // per)).cast(dtypes.uint)) & ((1 << (WORD_BITS // per)) - 1)
        if high is not None:
            v = v | (((high_word >> (bit % WORD_BITS).cast(dtypes.uint)) & ((1 << high_width) - 1)) << 4)
        return v.cast(dtypes.float), g * self.group + w * per + j, (j, w)

    def _exponent_unpack(self, word, j, high_word, bit):
        """Value j of the word as a float with no conversion: its bits, masked where they lie (or shifted
        once, for the word's upper values), become the low mantissa bits of a float whose exponent field
        makes one mantissa step worth 1 (2**23 / 2**p for a value at bit p), and that power of two is taken
        away: exact, since every operand and the result are whole numbers a float holds."""
        from tinygrad import dtypes
        width = WORD_BITS // self.values_per_word
        pos = j * width
        fits = (pos + self.bits) <= MANTISSA_BITS      # the value's bits lie below the exponent field
        p = fits.where(pos, pos - upper_shift(width, self.bits))
        unsigned = lambda u: u.cast(dtypes.uint)
        low_bits = (word >> unsigned(fits.where(0, upper_shift(width, self.bits)))) & unsigned(((1 << width) - 1) << p)
        if high_word is not None:
            mask = (1 << (self.bits - 4)) - 1
            low_bits = low_bits | (((high_word >> unsigned(bit % WORD_BITS)) & mask) << unsigned(p + 4))
        power = unsigned((FLOAT_BIAS + MANTISSA_BITS - p) << MANTISSA_BITS)     # the float 2**(23 - p)
        return (low_bits | power).bitcast(dtypes.float) - power.bitcast(dtypes.float)


def in_place(x, dtype=None):
    """The output of another generated kernel that x is (of `dtype`, where given), below reshapes and permutes
    that move only axes of one (its elements in the same order), or None: tinygrad copies any view of a custom
    kernel's output before another custom kernel reads it (a kernel a token for each such product), and a
    kernel that indexes its input flat can read that output where it lies."""
    from tinygrad import Tensor
    from tinygrad.uop.ops import Ops
    u = x.uop
    while u.op in (Ops.RESHAPE, Ops.PERMUTE):
        if u.op is Ops.PERMUTE:
            moved = [a for a in u.arg if u.src[0].shape[a] != 1]
            if moved != sorted(moved):
                return None
        u = u.src[0]
    if u.op is Ops.AFTER and any(s.op is Ops.CALL for s in u.src) and dtype in (None, u.dtype):
        return Tensor(u)
    return None


def _unpack(packed, width: int):
    """The inverse of _pack: (..., n) bytes -> (..., n, 8/width) values, the lowest bits first."""
    from tinygrad import Tensor
    mask = (1 << width) - 1
    return Tensor.stack(*[packed.rshift(width * j).bitwise_and(mask) for j in range(8 // width)], dim=-1)


def _pack(u, width: int):
    """uint8 values below 2**width, 8/width of them per byte, the first in the lowest bits."""
    from tinygrad import dtypes
    per = 8 // width
    u = u.reshape(*u.shape[:-1], u.shape[-1] // per, per)
    packed = u[..., 0]
    for j in range(1, per):
        packed = packed.bitwise_or(u[..., j].lshift(width * j))
    return packed.cast(dtypes.uint8)


def repack(blocks, fmt: str, rows: int, cols: int, scale_dtype: str = "float16") -> Planes:
    """A (rows x cols) weight's GGUF blocks (uint8, rows*cols/elements x block bytes) -> its planes, lazy."""
    return repack_all([(blocks, fmt, rows, cols)], scale_dtype)[0]


def repack_all(weights: list[tuple], scale_dtype: str = "float16") -> list[Planes]:
    """Several weights' planes (each (blocks, fmt, rows, cols) as repack takes it), lazy: their offsets and
    scales realized together and their zero points read in one sync, since each realize and each read walks
    every live tensor's graph (the whole model's among them)."""
    from tinygrad import Tensor
    steps = [_scales(*w) for w in weights]
    Tensor.realize(*(t for step in steps for t in step[1:3]))
    # the zero point of the offsets the planes keep: for signed values, shifted to the unsigned values stored
    zeros = _zero_points([(scale, offset + _value_range(values)[0] * scale if values.signed else offset)
                          for values, offset, scale, _ in steps])
    return [_planes(*step, zero, scale_dtype) for step, zero in zip(steps, zeros)]


def _value_range(values) -> tuple[int, int]:
    """The lowest and highest whole value a format's values take."""
    return (-(1 << (values.bits - 1)), (1 << (values.bits - 1)) - 1) if values.signed else (0, (1 << values.bits) - 1)


def _scales(blocks, fmt: str, rows: int, cols: int) -> tuple:
    """repack's first step: (values, offset, scale, w), the weight decoded, a group's offset and scale read off
    by decoding the blocks with their values zeroed and then one (lazy)."""
    from tinygrad import Tensor
    from tinygrad.llm.gguf import ggml_data_to_tensor
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    values = values_of(fmt)
    if values is None:
        raise BadInput(f"format {fmt}: formats.toml does not describe its values, so the repacked layout cannot take it "
                       f"(search-space-incomplete)")
    qtype = GGMLQuantizationType[fmt]
    elements, block_bytes = GGML_QUANT_SIZES[qtype]
    if cols % elements:
        raise BadInput(f"format {fmt}: rows of {cols} elements are not whole blocks")
    n, dev = rows * cols, blocks.device
    blocks = blocks.reshape(-1, block_bytes)
    keep_np, one_np = _patterns(values, block_bytes)
    keep, one = Tensor(keep_np, device=dev), Tensor(one_np, device=dev)
    decode = lambda b: ggml_data_to_tensor(b.flatten(), n, qtype.value).reshape(rows, cols // values.group, values.group)
    w = decode(blocks)
    offset = decode(blocks * keep)[:, :, 0].contiguous()
    scale = (decode(blocks * keep + one)[:, :, 0] - offset).contiguous()
    return values, offset, scale, w


def _planes(values, offset, scale, w, zero: int | None, scale_dtype: str) -> Planes:
    """repack's last step: the values of w by the realized offset and scale, packed into planes (lazy)."""
    from tinygrad import dtypes
    rows, cols = w.shape[0], w.shape[1] * w.shape[2]
    lo, hi = _value_range(values)
    q = (scale.unsqueeze(-1) != 0).where((w - offset.unsqueeze(-1)) / scale.unsqueeze(-1), 0).round().clip(lo, hi)
    if values.signed:   # stored unsigned: value + 2**(bits-1), the offset takes it back
        q, offset = q - lo, offset + lo * scale
    u = q.reshape(rows, cols).cast(dtypes.uint8)
    low = u if values.bits == 8 else _pack(u.bitwise_and(15), 4)
    high = _pack(u.rshift(4), values.bits - 4) if 4 < values.bits < 8 else None
    sdt = getattr(dtypes, scale_dtype)
    return Planes(rows, cols, values.bits, values.group, low, high, scale.cast(sdt),
                  None if zero is not None else offset.cast(sdt), zero or 0)


def _zero_points(pairs: list[tuple]) -> list[int | None]:
    """For each (scale, offset): the one whole number z with offset == -z x scale in every group, if there is
    one; all read in one sync."""
    from tinygrad import Tensor
    stats = []
    for scale, offset in pairs:
        big = scale.abs().max()
        z = (scale.abs() == big).where(-offset / scale, float("-inf")).max().round()    # read off the largest scale
        exact = ((offset + z * scale).abs() <= 1e-6 * scale.abs()).all()
        stats += [big, z, exact.float(), offset.abs().max()]
    read = Tensor.stack(*stats).tolist()
    return [_zero_of(*read[i:i + 4]) for i in range(0, len(read), 4)]


def _zero_of(biggest: float, z: float, exact: float, offsets: float) -> int | None:
    if not np.isfinite(biggest):        # a block with a non-finite scale: keep every offset
        return None
    if biggest == 0:
        return 0 if offsets == 0 else None
    return int(z) if exact else None


def _matches(planes: Planes, ref) -> bool:
    """The planes decode to the default route's weights, within its own rounding to fp16."""
    return _all_match([(planes, ref)])[0]


def _all_match(pairs: list[tuple]) -> list[bool]:
    """_matches for each (planes, ref), read in one sync."""
    from tinygrad import Tensor
    stats = []
    for planes, ref in pairs:
        diff = planes.weights() - ref
        stats += [diff.abs().max(), ref.abs().max(), (diff != diff).any().float()]
    read = Tensor.stack(*stats).tolist()
    # tinygrad's max passes over NaNs: they are counted apart
    return [not nans and err <= 2e-3 * top for err, top, nans in zip(read[0::3], read[1::3], read[2::3])]


def _reordered(planes: Planes, ref, most_rows: int = 16384) -> Planes | None:
    """The planes with their rows in the order the model's loader put them (some loaders permute a
    projection's rows), found by matching rows on four random projections, then checked whole."""
    from tinygrad import Tensor
    if planes.rows > most_rows:
        return None
    probe = Tensor(np.random.default_rng(0).standard_normal((planes.cols, 4)).astype(np.float32), device=ref.device)
    want, have = (ref @ probe).numpy(), (planes.weights() @ probe).numpy()
    order = np.array([int(np.argmin(((have - row) ** 2).sum(1))) for row in want])
    if len(set(order.tolist())) != planes.rows:
        return None
    idx = Tensor(order.astype(np.int32), device=ref.device)
    moved = [None if t is None else t[idx].contiguous() for t in (planes.low, planes.high, planes.scale, planes.offset)]
    out = Planes(planes.rows, planes.cols, planes.bits, planes.group, *moved, zero=planes.zero)
    Tensor.realize(*out.tensors())
    return out if _matches(out, ref) else None


class LayoutLinear:
    """Stands in for a model's linear layer: the same product, read from the planes, or, for a layer
    stacked with others, its rows of the stack's product. Each layer of a stack builds the same lazy
    product for the same input, and tinygrad keeps one copy of identical graphs, so a block
    multiplies its input by the whole stack once (a layer given another input gets its own product)."""
    def __init__(self, planes: Planes, bias, form: str, rows: slice | None = None, entries: tuple = ()):
        self.planes, self.bias, self.form, self.rows = planes, bias, form, rows
        self.entries = entries      # the GGUF tensors the planes hold (a stack's: every layer's)
        self.norm = None            # the RMS norm folded into the product (route/fusion.py): its input comes un-normed

    def __call__(self, x):
        return self.rows_of(x, copied=True)

    def rows_of(self, x, copied: bool = False):
        """The layer's rows of its planes' product; `copied` makes a stack's product contiguous before its
        rows are taken, as the model's own calls do (uncopied there, on the CPU, the query's and key's
        readers gained as many kernels as gate's and up's lost; route/fusion.py's `gated` reads them uncopied)."""
        y = self.planes.gemv(x, self.form, self.norm)
        if self.rows is not None:
            y = (y.contiguous() if copied else y)[..., self.rows]
        return y if self.bias is None else y + self.bias


def stacks(items: list, entry=lambda item: item) -> list[list]:
    """Items (census entries, or what `entry` finds one in) in groups a block multiplies by one input
    (roles.SHARED_INPUT) that share a format and a row length, in order; every other item alone."""
    group_of = {role: i for i, g in enumerate(SHARED_INPUT) for role in g}
    keyed: dict[Any, list] = {}
    for item in items:
        t = entry(item)
        key = (t.block, group_of[t.role], t.format, t.shape[0]) if t.role in group_of and t.block is not None else id(t)
        keyed.setdefault(key, []).append(item)
    return list(keyed.values())


def stacked(parts: list[Planes]) -> Planes:
    """Planes one above another: one matrix holding each part's rows in turn, realized."""
    from tinygrad import Tensor
    cat = lambda ts: None if ts[0] is None else Tensor.cat(*ts, dim=0).contiguous()
    first = parts[0]
    out = Planes(sum(p.rows for p in parts), first.cols, first.bits, first.group,
                 *(cat([getattr(p, f) for p in parts]) for f in ("low", "high", "scale", "offset")), zero=first.zero)
    Tensor.realize(*out.tensors())
    return out


def _stack_key(p: Planes) -> tuple:
    """Planes stack only with planes of the same shape of storage and the same zero point."""
    return p.cols, p.bits, p.group, p.high is None, p.offset is None, p.zero, p.scale.dtype


def layers(net, census) -> list[LayoutLinear]:
    """The layout's layers in the loaded model, found where the census's tensors load."""
    found = [module_at(net, "output" if t.tied else t.name.removesuffix(".weight")) for t in census.tensors]
    return [f[2] for f in found if f is not None and isinstance(f[2], LayoutLinear)]


def _fits(stored, name: str, t, setting: Setting) -> bool:
    """The archive's arrays of this matrix are planes of its shape and format, in this setting's scale type."""
    values = values_of(t.format)
    cols, rows = t.shape
    scales = ((rows, cols // values.group), np.dtype(setting.scale_dtype))
    want = {"low": ((rows, cols if values.bits == 8 else cols // 2), np.dtype(np.uint8)),
            "high": ((rows, cols * (values.bits - 4) // 8), np.dtype(np.uint8)) if 4 < values.bits < 8 else None,
            "scale": scales, "offset": scales if f"{name}/offset" in stored.shapes else None}
    return all(stored.shapes.get(f"{name}/{part}") == shape_type for part, shape_type in want.items())


def _read_back(stored, matrices, setting: Setting) -> list[Planes | None] | None:
    """Each matrix's planes from the archive, on the device (None for one that matched in no row order), or None
    where the archive lacks one, holds one of another shape or type, or cannot be read whole; the archive closed."""
    from tinygrad import Tensor
    if stored is None:
        return None
    try:
        if not all(name in stored.matrices and (not stored.matrices[name].matched or _fits(stored, name, t, setting))
                   for t, name, _ in matrices):
            return None
        kept = []
        for t, name, (_, _, linear) in matrices:
            if not stored.matrices[name].matched:
                kept.append(None)
                continue
            values = values_of(t.format)
            cols, rows = t.shape
            low, high, scale, offset = (Tensor(stored.array(key), device=linear.weight.device)
                                        if (key := f"{name}/{p}") in stored.shapes else None for p in planes_cache.PARTS)
            kept.append(Planes(rows, cols, values.bits, values.group, low, high, scale, offset,
                               stored.matrices[name].zero))
    except planes_cache.UNREADABLE:
        return None
    finally:
        stored.close()
    Tensor.realize(*(p for planes in kept if planes is not None for p in planes.tensors()))
    return kept


def module_at(net, path: str):
    """The attribute a GGUF tensor name ("blk.3.ffn_up") loads into, or None."""
    parent, obj = None, net
    for part in path.split("."):
        if part.isdigit() and isinstance(obj, list):
            parent, obj = obj, obj[int(part)] if int(part) < len(obj) else None
        else:
            parent, obj = obj, getattr(obj, part, None)
        if obj is None:
            return None
    return parent, part, obj


@dataclass
class _Built:
    entry: Any          # the census's TensorEntry
    parent: Any
    attr: str
    bias: Any
    planes: Planes

    def swap(self, layer) -> None:
        if isinstance(self.parent, list):
            self.parent[int(self.attr)] = layer
        else:
            setattr(self.parent, self.attr, layer)


def _by_block(matrices: list) -> list[list]:
    """The matrices in runs of one block's, in order (one outside a block alone): repacked together, each block's
    graph is the one before's with other buffers, which tinygrad's schedule cache takes without scheduling again
    (on the CPU it halved the repack of a 36-block model, 145 s to 71 s)."""
    runs = itertools.groupby(matrices, lambda m: m[0].block if m[0].block is not None else id(m))
    return [list(run) for _, run in runs]


def install(net, census, model_path: str, setting: Setting) -> Prepared:
    """Repack every linear layer whose format the family takes, on the model's device, and swap it in.

    Each repacked matrix is checked against the weight the default route would use (tinygrad's
    decode, rounded to fp16); where the loader reordered a projection's rows, the planes' rows follow.
    A layer that matches in no row order keeps the default route and is named in the notes. With the
    stack on, the checked planes of layers a block multiplies by one input are stacked into one matrix."""
    import pathlib
    import time

    from tinygrad import Tensor, nn

    t0 = time.perf_counter()
    matrices = []       # (census entry, its name, where it lies in the model, the linear layer)
    for t in census.tensors:
        if len(t.shape) != 2 or values_of(t.format) is None:
            continue
        name = "output" if t.tied else t.name.removesuffix(".weight")
        found = module_at(net, name)
        if found is not None and isinstance(found[2], nn.Linear):
            matrices.append((t, name, found))
    eligible = len(matrices)
    where, ident = planes_cache.path_for(model_path, setting.scale_dtype), planes_cache.identity(model_path, setting.scale_dtype)
    kept = _read_back(planes_cache.load(where, ident), matrices, setting)
    notes: list[str] = [] if kept is None else [f"the repacked planes read back from {where} (built and checked by an "
                                                f"earlier run)"]
    if kept is None:
        blob = Tensor(pathlib.Path(model_path))
        kept = []
        with planes_cache.Writing(where if eligible else None, ident) as archive:
            for batch in _by_block(matrices):
                blocks = [blob[t.data_offset:t.data_offset + t.bytes].to(linear.weight.device)
                          for t, _, (_, _, linear) in batch]
                Tensor.realize(*blocks)
                repacked = repack_all([(b, t.format, t.shape[1], t.shape[0]) for b, (t, _, _) in zip(blocks, batch)],
                                      setting.scale_dtype)
                Tensor.realize(*(p for planes in repacked for p in planes.tensors()))
                refs = [linear.weight.float() for _, _, (_, _, linear) in batch]
                for (t, name, _), planes, ref, ok in zip(batch, repacked, refs, _all_match(list(zip(repacked, refs)))):
                    planes = planes if ok else _reordered(planes, ref)
                    archive.keep(name, planes)
                    kept.append(planes)
        notes += [archive.note] if archive.note else []
    built: list[_Built] = []
    for (t, name, (parent, attr, linear)), planes in zip(matrices, kept):
        if planes is None:
            notes.append(f"{name}: the repacked weights match the default route's in no row order; kept the default")
        else:
            built.append(_Built(t, parent, attr, linear.bias, planes))
    if not eligible:
        raise BadInput(f"model {model_path}: no linear layer in a format the repacked layout takes "
                       f"({', '.join(formats_with_layout())}); run without --layout")
    groups = stacks(built, lambda b: b.entry) if setting.stack == "stacked" else [[b] for b in built]
    placed: dict[int, tuple] = {}
    nbytes = 0
    for group in groups:
        by_key: dict[tuple, list[_Built]] = {}
        for b in group:
            by_key.setdefault(_stack_key(b.planes), []).append(b)
        for parts in by_key.values():
            planes = stacked([b.planes for b in parts]) if len(parts) > 1 else parts[0].planes
            start = 0
            for b in parts:
                rows = slice(start, start + b.planes.rows) if len(parts) > 1 else None
                b.swap(LayoutLinear(planes, b.bias, setting.form, rows, tuple(x.entry for x in parts)))
                start, b.planes = start + b.planes.rows, planes     # the separate planes can go
            for p in planes.tensors():
                placed[id(p.uop.base.buffer.base)] = tuple(b.entry for b in parts)
            nbytes += planes.nbytes
    return Prepared(LAYOUT_LABEL, asdict(setting), applied=len(built),
                    eligible=eligible, bytes=nbytes, seconds=time.perf_counter() - t0, placed=placed, notes=notes)



PARTIAL_BYTES = 4     # a factored gemv's partial sum per row and group, fp32, written then read
# How each form's products are written (future.WRITERS): the compiler's tensor code, or one kernel
# generated at tinygrad's UOp level.
WRITTEN_BY = {"expanded": "tensor_code", "factored": "tensor_code", "kernel": "generated_kernel"}


def taken_by_layout(t) -> bool:
    """A layer the layout repacks: a 2-D table in a format it describes, not the embedding lookup."""
    return len(t.shape) == 2 and values_of(t.format) is not None and t.role not in (None, "token_embd")


def taken_groups(census, setting: Setting) -> list[list]:
    """The layers the layout takes, in the groups one product reads: a stack each when the stack is on,
    else one layer each."""
    taken = [t for t in census.tensors if taken_by_layout(t)]
    return stacks(taken) if setting.stack == "stacked" else [[t] for t in taken]


def layout_products(census, setting: Setting) -> list[Planes]:
    """The products one token runs with the layout, as planes without tensors (their shapes and bits):
    one a layer, or one a stack when the stack is on."""
    products = []
    for group in taken_groups(census, setting):
        v = values_of(group[0].format)
        products.append(Planes(sum(t.shape[1] for t in group), group[0].shape[0], v.bits, v.group,
                               None, None, None, None))
    return products


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


def foresee(census, setting: Setting, context: int, target, cal: Calibration, on=None) -> Foreseen:
    """The planes' bytes at the fraction of the bandwidth products written as this form's are measured
    to reach on the target (the whole bandwidth where that is unmeasured)."""
    nbytes, writer = predicted_bytes(census, setting), WRITTEN_BY[setting.form]
    fraction = cal.fraction(writer)
    return Foreseen(nbytes, predicted_products(census, setting), nbytes / (target.bandwidth * fraction) * 1e6,
                    ("bandwidth",) if fraction == 1.0 else ("bandwidth", f"measured {writer}"), fraction)


# What the gemv geometry and fusion build on: the layout's products as one generated kernel.
KERNEL_FORM = Needs("the layout's generated kernel", "--layout SCALES:kernel[:stacked]",
                    "a route whose layout form is kernel",
                    lambda settings: "layout" in settings and settings["layout"].form == "kernel")

# What the layout's products (and the gemv geometry of its kernel) run in place of: every weight role's region
# but the norms', whose 1-D tables it does not take (taken_by_layout).
PRODUCTS = Replaces(regions=tuple(r for r in REGIONS if r != "norms"))

FAMILY = Family(SPACE, LAYOUT_LABEL, "layout", install=install, read=knobs(Setting, later=("stack",)),
                of_values=Setting.of_values, foresee=foresee, metavar="SCALES:FORM[:stacked]", parse=Setting.parse,
                replaces=PRODUCTS,
                help="repack the quantized linear layers at load into the generated layout (scales float16 or "
                     "float32; gemv form expanded, factored, or kernel: the factored product as one kernel generated "
                     "at tinygrad's UOp level; stacked: the layers a block multiplies by one input in one matrix), "
                     "e.g. float16:expanded:stacked; overrides a route's layout; `none` turns it off")
