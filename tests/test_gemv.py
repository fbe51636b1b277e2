"""The gemv geometry family: the layout's generated kernel on 32-bit words, spread over the chip's threads
as one setting of spaces.toml's `gemv` says. Checked against tinygrad's own decode for every format on
the CPU (loads and rows a thread), and on tinygrad's PYTHON device, which runs thread groups, for the
threads; BubbleBeam's rules, FutureSight's order, and the search and profile that take it."""
import dataclasses
import json
import math
import sys

import numpy as np
import pytest

from boltbeam.bound.targets import get_target
from boltbeam.errors import BadInput
from boltbeam.judge.verdicts import VERDICTS
from boltbeam.measure import trace as tracefile
from boltbeam.read.census import take_census
from boltbeam.route import gemv, layout
from boltbeam.route.gemv import Geometry
from boltbeam.search import choose
from boltbeam.foresight.future import PER_KERNEL_FACT, Calibration
from tests.processes import DEPTH
from tests.test_families import blocks, reference
from tests.test_profile import refuses, refuses_routes

ROWS, COLS = 64, 1024
# Each knob at more than one value, loads of every width, and rows a thread of every count.
GEOMETRIES = [Geometry(1, 1, 1, 4), Geometry(8, 4, 2, 16), Geometry(2, 16, 4, 8), Geometry(32, 1, 1, 16),
              Geometry(4, 8, 2, 4), Geometry(8, 4, 2, 16, 1), Geometry(1, 1, 4, 4, 1),    # these two: sums once
              Geometry(8, 4, 2, 16, 0, 2), Geometry(1, 1, 4, 8, 1, 4),                     # groups a step
              Geometry(8, 4, 2, 16, 0, 1, 1), Geometry(1, 1, 4, 4, 1, 2, 1), Geometry(2, 16, 1, 8, 0, 1, 1)]  # unpacked
                                                                                           # under an exponent


def kernels(p, x) -> list:
    """The kernels the planes' generated product on input x schedules (nothing runs)."""
    from tinygrad.uop.ops import Ops
    p.memo = None
    return [c.src[0] for c in p.kernel_product(x).linear_with_vars()[0].src if c.src[0].op is Ops.SINK]


def words(fmt: str, rng, rows: int = ROWS, cols: int = COLS):
    """A format's random blocks, their reference weights, and their planes held as words."""
    b = blocks(fmt, rng, rows, cols)
    p = layout.repack(b, fmt, rows, cols, "float32")
    p.to_words()
    return reference(b, fmt, rows, cols), p


@pytest.mark.parametrize("fmt", layout.formats_with_layout())
def test_word_kernel_equals_tinygrads_decode_at_every_geometry(fmt):
    from tinygrad import Tensor
    rng = np.random.default_rng(11)
    b = blocks(fmt, rng, ROWS, COLS)
    ref, p = reference(b, fmt, ROWS, COLS), layout.repack(b, fmt, ROWS, COLS, "float32")
    before = p.weights().numpy()
    p.to_words()
    assert p.words and np.array_equal(p.weights().numpy(), before)     # the same bytes, read as words
    x = rng.standard_normal(COLS).astype(np.float32)
    want = ref @ x
    for g in GEOMETRIES:
        opts = g.opts(p, 1, has_local=False)
        assert opts is not None and not {o.op.name for o in opts} & {"LOCAL", "GROUP"}   # a CPU: no threads
        p.geometry, p.memo = g, None
        got = p.gemv(Tensor(x).reshape(1, 1, COLS), "kernel").numpy().ravel()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (fmt, g.flag)
        # Every listed format stores an offset or a zero point, so the input's group sums, asked once, are
        # a kernel of their own before the product's.
        assert g.sums_once(p) == bool(g.input_sums)
        assert len(kernels(p, Tensor(x).reshape(1, COLS).realize())) == 1 + g.input_sums, (fmt, g.flag)
    # Several input rows (a prefill) take the compiler's opts, never the geometry's, and are right too.
    xs = rng.standard_normal((3, COLS)).astype(np.float32)
    p.memo = None
    got = p.gemv(Tensor(xs).reshape(1, 3, COLS), "kernel").numpy().reshape(3, ROWS)
    assert np.abs(got - xs @ ref.T).max() <= 1e-5 * np.abs(xs @ ref.T).max()


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0"])    # an offset plane; a zero point and high bits; bytes
def test_thread_groups_run_the_geometry_they_are_given(fmt):
    """On a device with thread groups (tinygrad's PYTHON device runs them one by one), a geometry's kernel
    computes the same product and launches rows_per_group x lanes_per_row threads a group."""
    from tinygrad import Device, Tensor, dtypes
    from tinygrad.codegen import to_program
    from tinygrad.uop.ops import Ops
    rng = np.random.default_rng(5)
    rows, cols = 64, 256
    _, p = words(fmt, rng, rows, cols)
    # The PYTHON device carries floats through Python's, which quiets a signaling NaN; no word here is a NaN
    # once bit 30 is clear (real devices move a float's bits unchanged: the CPU test above has NaN words).
    clear = lambda t: None if t is None else (t.bitcast(dtypes.uint32) & ~(1 << 30)).bitcast(dtypes.float32).contiguous()
    p.low, p.high = clear(p.low), clear(p.high)
    w = p.weights().numpy()
    on = dataclasses.replace(p, **{f: t.to("PYTHON").realize() for f in ("low", "high", "scale", "offset")
                                   if (t := getattr(p, f)) is not None})
    x = rng.standard_normal(cols).astype(np.float32)
    for g in (Geometry(8, 4, 2, 16), Geometry(2, 16, 1, 8)):
        on.geometry, on.thread_groups, on.memo = g, True, None
        product = lambda: on.kernel_product(Tensor(x, device="PYTHON").reshape(1, cols))
        got = product().numpy().ravel()
        assert np.abs(got - w @ x).max() <= 1e-5 * np.abs(w @ x).max(), (fmt, g.flag)
        sink = next(call.src[0] for call in product().linear_with_vars()[0].src
                    if call.src[0].op is Ops.SINK and call.src[0].arg.name.startswith("gemv_words"))
        info = to_program(sink, Device["PYTHON"].renderer).arg
        assert math.prod(info.local_size) == g.rows_per_group * g.lanes_per_row
        assert math.prod(info.global_size) == rows // (g.rows_per_group * g.rows_per_thread)


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
def test_many_lanes_a_row_and_the_input_sums_once_on_thread_groups(fmt):
    """Up to 256 threads splitting one row's groups (combined in local memory), with the input's group sums
    computed once or in every thread, two groups a step, values unpacked under an exponent: on the PYTHON device, the product stays the
    planes' weights times the input and each group launches rows_per_group x lanes_per_row threads."""
    from tinygrad import Device, Tensor, dtypes
    from tinygrad.codegen import to_program
    rng = np.random.default_rng(8)
    rows, cols = 2, 4096            # 128 groups a row (Q4_K), 256 (Q6_K)
    _, p = words(fmt, rng, rows, cols)
    clear = lambda t: None if t is None else (t.bitcast(dtypes.uint32) & ~(1 << 30)).bitcast(dtypes.float32).contiguous()
    p.low, p.high = clear(p.low), clear(p.high)     # no NaN words on the PYTHON device (see the test above)
    w = p.weights().numpy()
    on = dataclasses.replace(p, **{f: t.to("PYTHON").realize() for f in ("low", "high", "scale", "offset")
                                   if (t := getattr(p, f)) is not None})
    x = rng.standard_normal(cols).astype(np.float32)
    for g in (Geometry(128, 1, 2, 16), Geometry(64, 2, 1, 8, 1, 2), Geometry(32, 1, 2, 16, 0, 2, 1)):
        on.geometry, on.thread_groups, on.memo = g, True, None
        xt = Tensor(x, device="PYTHON").reshape(1, cols)
        got = on.kernel_product(xt).numpy().ravel()
        assert np.abs(got - w @ x).max() <= 1e-5 * np.abs(w @ x).max(), (fmt, g.flag)
        product = next(k for k in kernels(on, xt) if k.arg.name.startswith("gemv_words"))
        info = to_program(product, Device["PYTHON"].renderer).arg
        assert math.prod(info.local_size) == g.rows_per_group * g.lanes_per_row, (fmt, g.flag)
        assert math.prod(info.global_size) == rows // (g.rows_per_group * g.rows_per_thread)


def test_a_geometry_fits_a_shape_or_leaves_it_to_the_compiler():
    rng = np.random.default_rng(2)
    _, q4 = words("Q4_K", rng, 32, 512)  # 32 rows, 16 groups a row, 4 words a group
    assert Geometry(32, 1, 1, 16).opts(q4) is None                  # 32 lanes, 16 groups
    assert Geometry(1, 16, 4, 4).opts(q4) is None                   # 64 rows a group
    assert Geometry(1, 1, 1, 4).opts(q4, n=2) is None               # two input rows
    assert Geometry(8, 4, 2, 16).words_per_load(q4) == 4
    _, q6 = words("Q6_K", rng, 32, 512)  # groups of 16: two words of low bits
    assert Geometry(8, 4, 2, 16).words_per_load(q6) == 2 == Geometry(8, 4, 2, 8).words_per_load(q6)
    assert Geometry(8, 4, 2, 16).opts(q6) == Geometry(8, 4, 2, 8).opts(q6)    # the whole group either way
    with pytest.raises(BadInput, match="load_bytes must be one of 4, 8, 16"):
        Geometry(8, 4, 2, 32)
    with pytest.raises(BadInput, match="expected LANES_PER_ROW:ROWS_PER_GROUP"):
        Geometry.parse("8:4")
    assert Geometry.parse("8:4:2:16") == Geometry(8, 4, 2, 16) and Geometry(8, 4, 2, 16).flag == "8:4:2:16"
    # The input's sums once: a fifth number, left out where it is 0 (so every earlier flag reads the same).
    assert Geometry.parse("8:4:2:16:1") == Geometry(8, 4, 2, 16, 1) and Geometry(8, 4, 2, 16, 1).flag == "8:4:2:16:1"
    assert Geometry.parse("8:4:2:16:0") == Geometry(8, 4, 2, 16)
    with pytest.raises(BadInput, match="input_sums must be one of 0, 1"):
        Geometry.parse("8:4:2:16:2")
    # Sums once take the sums' range out of the opts: one unroll fewer, the rest the same.
    once, each = Geometry(8, 4, 2, 16, 1).opts(q4), Geometry(8, 4, 2, 16).opts(q4)
    unrolls = lambda opts: [o for o in opts if o.op.name == "UNROLL"]
    assert len(unrolls(once)) == len(unrolls(each)) - 1
    assert [o for o in once if o.op.name != "UNROLL"] == [o for o in each if o.op.name != "UNROLL"]
    assert not Geometry(32, 1, 1, 16, 1).sums_once(q4)           # a geometry that does not fit does nothing
    # Groups a step: a sixth number (the fifth then written out), one more unroll, on the groups; the lanes
    # and the step must split a row's groups whole.
    assert Geometry.parse("8:4:2:16:0:2") == Geometry(8, 4, 2, 16, 0, 2) and Geometry(8, 4, 2, 16, 0, 2).flag == "8:4:2:16:0:2"
    stepped = Geometry(8, 1, 2, 16, 0, 2).opts(q4)
    assert len(unrolls(stepped)) == len(unrolls(Geometry(8, 1, 2, 16).opts(q4))) + 1
    assert Geometry(8, 1, 1, 16, 0, 2).opts(q4) is not None and Geometry(16, 1, 1, 16, 0, 2).opts(q4) is None   # 16 groups
    # Unpacking under an exponent: a seventh number; the same opts (it changes the kernel's arithmetic, not its
    # ranges), and nothing where the geometry does not fit.
    assert Geometry.parse("8:4:2:16:0:1:1") == Geometry(8, 4, 2, 16, 0, 1, 1) and Geometry(8, 4, 2, 16, 0, 1, 1).flag == "8:4:2:16:0:1:1"
    assert Geometry(8, 4, 2, 16, 0, 1, 1).opts(q4) == Geometry(8, 4, 2, 16).opts(q4)
    assert Geometry(8, 4, 2, 16, 0, 1, 1).unpacks_by_exponent(q4) and not Geometry(32, 1, 1, 16, 0, 1, 1).unpacks_by_exponent(q4)
    with pytest.raises(BadInput, match=r"\[:UNPACK\]"):
        Geometry.parse("8:4:2:16:0:1:1:1")


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K", "Q8_0", "Q5_1"])
def test_unpacking_under_an_exponent_converts_no_value(fmt):
    """With unpack 1 the word kernel turns no packed integer into a float (no conversion instruction for a
    value): every value is its masked bits under a fixed exponent, less that power of two; with 0 each is
    converted. Both equal the weights times the input (the CPU test above checks every format)."""
    from tinygrad import Tensor, dtypes
    from tinygrad.uop.ops import Ops
    rng = np.random.default_rng(4)
    _, p = words(fmt, rng)
    x = Tensor(rng.standard_normal((1, COLS)).astype(np.float32)).realize()
    converts = {}
    for unpack in (0, 1):
        p.geometry = Geometry(8, 4, 2, 16, 0, 1, unpack)
        product = next(k for k in kernels(p, x) if k.arg.name.startswith("gemv_words"))
        converts[unpack] = sum(u.op is Ops.CAST and u.dtype == dtypes.float and dtypes.is_int(u.src[0].dtype)
                               for u in product.toposort())
        floats = [u for u in product.toposort() if u.op is Ops.BITCAST and u.dtype == dtypes.float]
        assert bool(floats) == bool(unpack), (fmt, unpack)
    assert converts[0] > 0 and converts[1] == 0, (fmt, converts)


def test_bubblebeam_keeps_the_geometries_the_chips_facts_allow():
    h200 = get_target("h200")
    legal, rejected = choose.space(gemv.FAMILY, h200)
    assert legal and all(g.lanes_per_row * g.rows_per_group % 32 == 0 for g in legal)
    assert all(g.lanes_per_row * g.rows_per_group <= 1024 for g in legal)
    assert rejected["thread_group_width: partial thread groups leave lanes idle"] > 0
    assert len(legal) + sum(rejected.values()) == 9 * 6 * 3 * 3 * 2 * 3 * 2
    assert rejected["max_threads_per_group: a group cannot hold more threads than the chip allows"] > 0   # 256 x 8
    # A chip that declares no thread-group width gets no geometry, and says which fact it lacks.
    from tests.test_search import CPU_TARGETS
    cpu = get_target("host-like", [CPU_TARGETS])
    legal, rejected = choose.space(gemv.FAMILY, cpu)
    assert not legal and rejected and all(why.startswith("the target declares no ") for why in rejected)
    with pytest.raises(BadInput, match="no setting of gemv is legal there"):
        choose.legal_space(gemv.FAMILY, cpu)


def test_futuresight_predicts_geometries_on_the_routes_products(tiny_model):
    census = take_census(tiny_model)
    h200, cal = get_target("h200"), Calibration(bandwidth_fraction={"generated_kernel": 0.3})
    on = {"layout": layout.Setting("float16", "kernel", "stacked")}     # the settings of the route it goes on
    assert "layout form is kernel" in gemv.FAMILY.refuses({"layout": layout.Setting("float16", "expanded", "stacked")})
    sight = {g.flag: gemv.foresee(census, g, 0, h200, cal, on) for g in choose.space(gemv.FAMILY, h200)[0]}
    # The same bytes whatever the geometry: the layout's planes, as the layout family counts them.
    layout_bytes = layout.predicted_bytes(census, layout.Setting("float16", "kernel", "stacked"))
    untaken = sum(t.bytes_per_token for t in census.tensors if not layout.taken_by_layout(t) and not t.tied)
    assert {s.bytes for s in sight.values()} == {layout_bytes - untaken}
    # Little's law: more bytes in flight a thread (wider loads) is never predicted slower at the same groups.
    assert sight["8:4:1:16"].memory_us <= sight["8:4:1:4"].memory_us
    # Nor more rows a thread, on a product of as many groups as multiprocessors or more...
    big = layout.Planes(24576, 4096, 4, 32, None, None, None, None)
    nbytes = big.rows * big.cols // 2
    more, fewer = (gemv.geometry_sight(big, nbytes, Geometry.parse(f), h200, cal) for f in ("8:4:4:16", "8:4:1:16"))
    assert more.memory_us <= fewer.memory_us and "multiprocessors in use" not in more.terms + fewer.terms
    # ...but the tiny model's products at 4 rows a thread leave most multiprocessors idle: each busy one its share.
    assert "multiprocessors in use" in sight["8:4:4:16"].terms
    assert sight["8:4:4:16"].memory_us > sight["8:4:1:16"].memory_us
    # The input's sums once: the same Little's law, and one more kernel at the target's measured cost.
    once, each = (gemv.geometry_sight(big, nbytes, Geometry.parse(f), h200, cal) for f in ("8:4:4:16:1", "8:4:4:16"))
    assert once.us == pytest.approx(each.us + h200.fact(PER_KERNEL_FACT) * 1e6) and once.us > each.us
    assert "one more kernel" in once.terms and "one more kernel" not in each.terms
    # Groups a step: more loads in flight a thread, never predicted slower.
    stepped = gemv.geometry_sight(big, nbytes, Geometry.parse("8:4:1:16:0:2"), h200, cal)
    assert stepped.memory_us <= gemv.geometry_sight(big, nbytes, Geometry.parse("8:4:1:16"), h200, cal).memory_us
    # A product whose rows a geometry does not divide is predicted at the generated kernel's measured rate.
    rows = {p.rows for p in layout.layout_products(census, on["layout"])}
    odd = next((g for g in choose.space(gemv.FAMILY, h200)[0] if any(r % (g.rows_per_group * g.rows_per_thread) for r in rows)), None)
    if odd is not None:
        assert "measured generated_kernel" in sight[odd.flag].terms


def test_profile_with_a_geometry_on_cpu(tiny_model, profiled, tiny_default, tmp_path, capsys):
    default = tracefile.load(tiny_default.path)
    geo = tracefile.load(profiled(tiny_model, *DEPTH, "--layout", "float32:kernel", "--gemv", "1:32:2:16"))
    fam = geo.route.settings["families"]["gemv-geometry"]
    assert geo.route.label == "generated-layout + gemv-geometry + tinygrad-scheduler"
    assert (fam["lanes_per_row"], fam["rows_per_group"], fam["rows_per_thread"], fam["load_bytes"]) == (1, 32, 2, 16)
    assert 0 < fam["applied"] <= fam["eligible"] and fam["bytes"] > 0
    assert geo.output_tokens == default.output_tokens
    # The classifier follows the words: every weight role the default route reads is found again.
    roles = lambda t: sorted(k.role for k in t.kernels_of_token(0) if k.category == "weights" and k.role != "token_embd")
    assert roles(geo) == roles(default)
    assert all(k.name.startswith("gemv_words") for k in geo.kernels_of_token(0)
               if k.category == "weights" and k.role != "token_embd")
    for flags, said in ((["--gemv", "1:32:2:16"], "needs --layout SCALES:kernel"),
                        (["--layout", "float32:expanded", "--gemv", "1:32:2:16"], "needs --layout SCALES:kernel"),
                        (["--layout", "float32:kernel", "--gemv", "1:32"], "expected LANES_PER_ROW"),
                        (["--layout", "float32:kernel", "--gemv", "3:32:2:16"], "lanes_per_row must be one of")):
        refuses(tiny_model, tmp_path, capsys, flags, said)
    refuses_routes(tiny_model, tmp_path, capsys, {"family": "gemv", "layout": {
        "scale_dtype": "float32", "form": "kernel", "stack": "stacked"}}, "gemv", (
        ("8:4:2:16", "gemv must be a table"), ({"lanes_per_row": 8}, "expected the keys"),
        ({"lanes_per_row": 3, "rows_per_group": 4, "rows_per_thread": 2, "load_bytes": 16}, "one of")))


def kernel_route(model: str, tmp_path):
    """A CPU described with thread groups (so some geometry is legal there) and a route on `model` whose layout
    runs the generated kernel, saved as tmp_path/on.json: (the targets file, the route)."""
    from boltbeam.files import sha256_file
    from boltbeam.measure import route as routes
    threads = tmp_path / "threads.toml"
    threads.write_text("\n".join(
        ["[cpu-with-groups]"] + [f'{k} = {{ value = {v}, unit = "{u}", status = "spec", source = "test", date = "2026-12-01" }}'
                                 for k, v, u in (("memory_bandwidth", 2.0e10, "B/s"), ("thread_group_width", 32, "threads"),
                                                 ("max_threads_per_group", 1024, "threads"),
                                                 ("local_memory_per_group", 65536, "B"))]) + "\n")
    on = routes.Route(sha256_file(model), routes.engine(), "CPU", "cpu-with-groups", "repacked_layout",
                      "generated by search", [], families={"layout": {"scale_dtype": "float32", "form": "kernel", "stack": "stacked"}})
    routes.save(on, tmp_path / "on.json")
    return threads, on


def test_search_judges_geometries_on_a_kernel_form_route(tiny_model, kernel_form, tmp_path):
    """search --family gemv --on ROUTE: BubbleBeam's legal geometries in FutureSight's order, the best
    judged whole against the route without them (the shared profile of such a route); the route it writes
    keeps the layout and the geometry."""
    from boltbeam.measure import route as routes
    from tests.test_search import _ok, _run
    threads, on = kernel_route(tiny_model, tmp_path)
    out, ledger = tmp_path / "gemv", tmp_path / "ledger.sqlite"
    cmd = [sys.executable, "-m", "boltbeam", "search", tiny_model, "--device", "CPU", "--target", "cpu-with-groups",
           "--targets", str(threads), "--family", "gemv", *DEPTH, "--ledger", str(ledger), "--budget", "1", "--json"]
    summary = json.loads(_ok(_run([*cmd, "--on", str(tmp_path / "on.json"), "--baseline", str(kernel_form.path),
                                   "--out", str(out)])).stdout)
    legal, rejected = choose.space(gemv.FAMILY, get_target("cpu-with-groups", [str(threads)]))
    assert len(summary["candidates"]) == len(legal) and summary["rejected_by_reason"] == dict(rejected)
    cands = summary["candidates"]
    assert [c["predicted_us"] for c in cands] == sorted(c["predicted_us"] for c in cands)
    judged = [c for c in cands if not c["skipped"]]
    assert judged == cands[:1] and judged[0]["verdict"] in VERDICTS
    from boltbeam.measure import trace as tracefile
    ran = tracefile.load(str(out / f"gemv_{judged[0]['setting'].replace(':', '_')}.json"))
    assert ran.route.label == "generated-layout + gemv-geometry + boltbeam-search"
    if summary["chosen"]:
        route = routes.load(str(out / "route.json"))
        assert route.families["layout"] == on.families["layout"] and Geometry(**route.families["gemv"]).flag == summary["chosen"]
    # Not on a route whose layout runs tensor code.
    routes.save(dataclasses.replace(on, families={"layout": {**on.families["layout"], "form": "expanded"}}),
                tmp_path / "expanded.json")
    done = _run([*cmd, "--on", str(tmp_path / "expanded.json"), "--out", str(tmp_path / "again")])
    assert done.returncode == 2 and "layout form is kernel" in done.stderr and not (tmp_path / "again").exists()


def test_a_geometry_for_each_product_goes_where_its_key_says(tiny_model):
    """PerProduct: its flag and its route table read back; installed, each product's planes take the geometry
    its facts name and a product it does not name keeps the compiler's opts; bad keys are one line."""
    from boltbeam.route import gemv
    per = gemv.PerProduct((("64x1024:q4:g32", Geometry(8, 4, 2, 16)), ("64x1024:q6:g16", Geometry(1, 32, 1, 4))))
    assert gemv.parse(per.flag) == per == gemv.PerProduct.from_table(per.stored(), "r")
    assert gemv.read(per.stored(), "r") == per and gemv.parse("8:4:2:16") == Geometry(8, 4, 2, 16)
    assert gemv.read({"lanes_per_row": 8, "rows_per_group": 4, "rows_per_thread": 2,
                      "load_bytes": 16}, "r") == Geometry(8, 4, 2, 16)       # a route file from before input_sums
    with_sums = gemv.PerProduct((("64x1024:q4:g32", Geometry(8, 4, 2, 16, 1)),))
    assert gemv.read(with_sums.stored(), "r") == with_sums == gemv.parse(with_sums.flag)
    rng = np.random.default_rng(3)
    _, q4 = words("Q4_K", rng)
    _, q6 = words("Q6_K", rng)
    _, q8 = words("Q8_0", rng)
    assert [gemv.product_key(p) for p in (q4, q6, q8)] == ["64x1024:q4:g32", "64x1024:q6:g16", "64x1024:q8:g32"]
    assert per.for_product(q4) == Geometry(8, 4, 2, 16) and per.for_product(q6) == Geometry(1, 32, 1, 4)
    assert per.for_product(q8) is None and Geometry(2, 16, 4, 8).for_product(q8) == Geometry(2, 16, 4, 8)
    for bad, said in (("64x1024=8:4:2:16", "PRODUCT=LANES"), ("64x1024:q4:g32=8:4", "expected LANES_PER_ROW"),
                      ("64x1024:q4:g32=8:4:2:16,64x1024:q4:g32=1:32:1:4", "once for each product"),
                      ("64x1024:q4:g32=3:4:2:16", "lanes_per_row must be one of")):
        with pytest.raises(BadInput, match=said):
            gemv.parse(bad)
    for table, said in (({"64x1024:q4:g32": {"lanes_per_row": 8}}, "r product 64x1024:q4:g32: .* expected the keys"),
                        ({"q4": {f: 1 for f in gemv.FIELDS}}, "expected a product"), ({"lanes_per_row": 8}, "expected the keys")):
        with pytest.raises(BadInput, match=said):
            gemv.read(table, "r")
    # Installed on a model: every kernel-form product gets the geometry its key names, or none.
    import pathlib

    from tinygrad.llm.model import Transformer
    census = take_census(tiny_model)
    net, _ = Transformer.from_gguf(pathlib.Path(tiny_model), 8)
    layout.install(net, census, tiny_model, layout.Setting("float32", "kernel", "stacked"))
    planes = {id(m.planes): m.planes for m in layout.layers(net, census)}.values()
    named = next(iter(planes))
    per = gemv.PerProduct(((gemv.product_key(named), Geometry(1, 32, 2, 8)),))
    done = gemv.install(net, census, tiny_model, per)
    assert done.settings == {"per_product": per.flag} and done.eligible == len(planes)
    assert all(p.words and p.geometry == (Geometry(1, 32, 2, 8) if gemv.product_key(p) == gemv.product_key(named)
                                          else None) for p in planes)
    assert done.applied == sum(gemv.product_key(p) == gemv.product_key(named) for p in planes) < done.eligible
    assert done.notes and "no geometry named" in done.notes[0]


def test_each_product_alone_checked_then_timed_in_futuresights_order(tiny_model):
    """search/alone.py: the layout's products by shape, counted as a token runs them; each timed at its
    best predicted geometries, at most `most`, each product checked before it is timed; the fastest chosen."""
    from boltbeam.route import gemv
    from boltbeam.search import alone
    # formats.toml's offset fact says which planes a format's blocks repack into, before any is built.
    rng = np.random.default_rng(0)
    for fmt in layout.formats_with_layout():
        p = layout.repack(blocks(fmt, rng, 32, 256), fmt, 32, 256)
        assert (p.offset is not None) == layout.values_of(fmt).offset and (p.zero != 0) != layout.values_of(fmt).offset, fmt
        assert p.zero in (0, alone.Shape(32, 256, p.bits, p.group, False).zero), fmt
    census = take_census(tiny_model)
    setting = layout.Setting("float16", "kernel", "stacked")
    shapes = alone.shapes(census, setting)
    products = layout.layout_products(census, setting)
    assert sum(shapes.values()) == len(products)
    assert sorted(gemv.product_key(s.planes()) for s in shapes.elements()) == sorted(map(gemv.product_key, products))
    assert {s.offset for s in shapes} == {True, False}        # Q4_K: an offset a group; Q6_K: a zero point
    target = get_target("h200")
    geometries = [Geometry(1, 32, 1, 4), Geometry(1, 32, 4, 16), Geometry(32, 1, 2, 8)]
    shape = next(s for s in shapes if not s.offset)
    got = alone.time_product(shape, shapes[shape], "float16", geometries, target, Calibration(), 2, 60.0, rng, reps=3)
    assert got.key == gemv.product_key(shape.planes()) and got.count == shapes[shape]
    assert got.legal == sum(g.divides(shape.planes()) for g in geometries) and len(got.timed) == min(2, got.legal)
    assert [r.predicted_us for r in got.timed] == sorted(r.predicted_us for r in got.timed)
    assert all(r.relative_error <= alone.CHECK and len(r.samples_us) == 3 and r.refused is None for r in got.timed)
    assert got.best_us == min(r.median_us for r in got.timed) and got.best in {r.geometry for r in got.timed}
    assert all(len(r.kernels_us) == 1 for r in got.timed)
    # Sums once: two kernels timed, each recorded, the product's time their sum run by run.
    two = alone.time_product(shape, 1, "float16", [Geometry(1, 32, 1, 4, 1)], target, Calibration(), 1, 60.0, rng, reps=3)
    (row,) = two.timed
    assert row.relative_error <= alone.CHECK and len(row.kernels_us) == 2 and len(row.samples_us) == 3
    assert row.median_us == pytest.approx(np.median(row.samples_us)) and min(row.kernels_us) > 0
    # Equal predictions are sampled across the space, not in the order they were listed: on a product whose
    # geometries FutureSight mostly predicts alike, the first timed are not simply the first listed.
    wide = alone.Shape(8192, 512, 4, 32, True)         # enough threads that many geometries reach the floor
    legal = [g for g in choose.space(gemv.FAMILY, target)[0] if g.divides(wide.planes())]
    alike = alone.time_product(wide, 1, "float16", legal, target, Calibration(), 4, 60.0, np.random.default_rng(1),
                               reps=1)
    best = min(r.predicted_us for r in alike.timed)
    listed = [g.flag for g in legal if gemv.geometry_sight(wide.planes(), alike.bytes, g, target, Calibration()).us
              == best]
    assert len(listed) > 4 and [r.geometry for r in alike.timed] != listed[:4]
    assert {r.geometry for r in alike.timed} <= set(listed)
    # Out of time before the first geometry: nothing timed, nothing chosen.
    none = alone.time_product(shape, 1, "float16", geometries, target, Calibration(), 2, 0.0, rng, reps=3)
    assert none.timed == [] and none.best is None


def test_a_compile_pool_compiles_every_geometry_and_the_product_is_timed_as_without(monkeypatch):
    """search/alone.py with a compile pool: each geometry's kernel is compiled in the pool's processes (this
    process generates none of them) and checked and timed as when it compiles them itself, in the same order;
    a kernel the pool's compiler refuses is that geometry's refusal."""
    import tinygrad.codegen as codegen
    from tinygrad import Device, Tensor
    from tinygrad.codegen.opt import Opt, OptOps
    from tinygrad.uop.ops import Ops
    from boltbeam.search import alone
    from boltbeam.search.compiler import compile_pool, compiled_in_order
    shape = alone.Shape(128, 512, 4, 32, True)
    geometries = [Geometry(1, 32, 4, 16), Geometry(32, 1, 2, 8), Geometry(1, 32, 1, 4, 1)]
    generated, orig = [], codegen.do_to_program

    def counted(ast, renderer):      # a kernel generated from its AST (not a program handed on)
        generated.append(getattr(ast.arg, "name", "") if ast.op is Ops.SINK else "")
        return orig(ast, renderer)
    monkeypatch.setattr(codegen, "do_to_program", counted)
    runs = {}
    for workers in (0, 2):
        monkeypatch.setattr(codegen, "to_program_cache", {})     # nothing kept from an earlier run here
        generated.clear()
        with compile_pool(workers) as pool:
            runs[workers] = alone.time_product(shape, 1, "float16", geometries, get_target("h200"), Calibration(), 3,
                                               60.0, np.random.default_rng(0), reps=1, pool=pool)
        here = sum(name.startswith("gemv") for name in generated)
        assert here > 0 if workers == 0 else here == 0
    here, pooled = runs[0].timed, runs[2].timed
    assert [r.geometry for r in pooled] == [r.geometry for r in here] and len(pooled) == runs[2].legal >= 2
    assert [r.relative_error for r in pooled] == [r.relative_error for r in here]
    assert all(r.refused is None and r.relative_error <= alone.CHECK and r.median_us > 0 for r in pooled)
    with compile_pool(1) as pool:      # an opt tinygrad refuses, sent as a geometry's kernel would be
        planes = alone.random_planes(shape, "float16", np.random.default_rng(0))
        planes.to_words()
        ast = alone.kernel_asts(planes, Tensor.ones(1, 512).contiguous())[0]
        (refusal,) = compiled_in_order([(ast, Device["CPU"].renderer, (Opt(OptOps.UPCAST, 0, 7),))], pool)
    assert refusal.startswith("tinygrad refuses")


def test_an_earlier_searchs_fastest_go_first(tmp_path):
    """--alone-from: an earlier search's times alone, fastest first by product, are timed first (up to half
    of `most`; only those legal here, each once), then FutureSight's order; a file that is not such a
    summary is one line."""
    from boltbeam.route import gemv
    from boltbeam.search import alone
    shape = alone.Shape(256, 512, 6, 16, False)        # every geometry below divides it
    key = gemv.product_key(shape.planes())
    target = get_target("h200")
    geometries = [Geometry(1, 32, 1, 4), Geometry(1, 32, 4, 16), Geometry(32, 1, 2, 8), Geometry(2, 16, 1, 8)]
    summary = tmp_path / "search.json"
    summary.write_text(json.dumps({"alone": [{"key": key, "timed": [
        {"geometry": "2:16:1:8", "median_us": 9.0}, {"geometry": "1:32:4:16", "median_us": 5.0},
        {"geometry": "64:1:1:8", "median_us": 1.0},                  # not among this search's geometries
        {"geometry": "1:32:1:4", "median_us": None, "refused": "tinygrad refuses"}]}]}))
    earlier = alone.earlier_times(str(summary))
    assert earlier == {key: [Geometry(64, 1, 1, 8), Geometry(1, 32, 4, 16), Geometry(2, 16, 1, 8)]}
    plain = alone.time_product(shape, 1, "float16", geometries, target, Calibration(), 4, 60.0,
                               np.random.default_rng(0), reps=1)
    got = alone.time_product(shape, 1, "float16", geometries, target, Calibration(), 4, 60.0,
                             np.random.default_rng(0), reps=1, earlier=earlier[key] * 2)
    assert plain.legal == got.legal == 4
    assert got.from_earlier == 2 and plain.from_earlier == 0
    assert [r.geometry for r in got.timed[:2]] == ["1:32:4:16", "2:16:1:8"]
    rest = [r.geometry for r in plain.timed if r.geometry not in ("1:32:4:16", "2:16:1:8")]
    assert [r.geometry for r in got.timed[2:]] == rest[:2] and len({r.geometry for r in got.timed}) == 4
    late = alone.time_product(shape, 1, "float16", geometries, target, Calibration(), 4, 0.0,
                              np.random.default_rng(0), reps=1, earlier=earlier[key])
    assert late.timed == [] and late.from_earlier == 0        # out of time before the first: none reached
    for doc, said in (([], "not a summary"), ({"alone": [{"key": key}]}, "not a summary"),
                      ({"alone": [{"key": key, "timed": [{"geometry": "8:4", "median_us": 1.0}]}]}, "expected LANES")):
        summary.write_text(json.dumps(doc))
        with pytest.raises(BadInput, match=said):
            alone.earlier_times(str(summary))


def test_search_times_each_product_alone_then_judges_a_geometry_for_each(tiny_model, kernel_form, tmp_path):
    """search --family gemv --alone K: each product of the route's layout timed alone at its K best predicted
    geometries, an earlier search's fastest first (--alone-from), and the geometry for each product judged
    first; its route keeps a geometry per product, as profile --route reads it back (gemv.read), and
    its summary is what a later --alone-from reads, each product's fastest first. --alone goes with --family
    gemv only."""
    from boltbeam.measure import route as routes
    from boltbeam.measure import trace as tracefile
    from boltbeam.route import gemv
    from boltbeam.search import alone
    from tests.test_search import _ok, _run
    threads, on = kernel_route(tiny_model, tmp_path)
    out = tmp_path / "gemv"
    cmd = [sys.executable, "-m", "boltbeam", "search", tiny_model, "--device", "CPU", "--target", "cpu-with-groups",
           "--targets", str(threads), *DEPTH, "--ledger", str(tmp_path / "l.sqlite"), "--budget", "1", "--json"]
    # An earlier search's times: for each product, the last legal geometry that divides it, timed fastest there.
    shapes = alone.shapes(take_census(tiny_model), layout.Setting(**on.families["layout"]))
    legal = choose.space(gemv.FAMILY, get_target("cpu-with-groups", [str(threads)]))[0]
    earlier = {gemv.product_key(s.planes()): [g for g in legal if g.divides(s.planes())][-1].flag for s in shapes}
    (tmp_path / "earlier.json").write_text(json.dumps({"alone": [
        {"key": key, "timed": [{"geometry": flag, "median_us": 1.0}]} for key, flag in earlier.items()]}))
    summary = json.loads(_ok(_run([*cmd, "--family", "gemv", "--alone", "2", "--seconds-per-kernel", "30",
                                   "--alone-from", str(tmp_path / "earlier.json"), "--on", str(tmp_path / "on.json"),
                                   "--baseline", str(kernel_form.path), "--out", str(out)])).stdout)
    timed = summary["alone"]
    assert sorted(p["key"] for p in timed) == sorted(earlier)
    assert all(0 < len(p["timed"]) <= 2 and p["best_us"] == min(r["median_us"] for r in p["timed"]) for p in timed)
    assert all(p["from_earlier"] == 1 and p["timed"][0]["geometry"] == earlier[p["key"]] for p in timed)
    first = summary["candidates"][0]
    assert first["predicted_terms"] == ["timed alone"] and not first["skipped"] and first["verdict"] in VERDICTS
    assert first["predicted_us"] == pytest.approx(sum(p["count"] * p["best_us"] for p in timed))
    assert gemv.PerProduct.parse(first["setting"]).stored() == {p["key"]: dataclasses.asdict(Geometry.parse(p["best"]))
                                                                 for p in timed}
    assert all(c["skipped"] for c in summary["candidates"][1:])     # the budget: one judged
    ran = tracefile.load(first["trace"])
    assert ran.route.settings["families"]["gemv-geometry"]["per_product"] == first["setting"]
    # What a later search reads back from this one's summary (--alone-from): each product's times, fastest first.
    again = alone.earlier_times(str(out / "search.json"))
    assert {key: geometries[0].flag for key, geometries in again.items()} == {p["key"]: p["best"] for p in timed}
    if summary["chosen"]:
        assert summary["chosen_trace"] == first["trace"]
        route = routes.load(str(out / "route.json"))
        assert gemv.read(route.families["gemv"], "r") == gemv.PerProduct.parse(first["setting"])
        assert route.families["layout"] == on.families["layout"]
    for flags, said in ((["--family", "fusion", "--alone", "2"], "go with --family gemv"),
                        (["--family", "gemv", "--alone", "0"], "go with --family gemv, 1 or more"),
                        (["--alone", "2"], "judge whole tokens"),
                        (["--family", "gemv", "--alone-from", str(out / "search.json")], "give --alone K too"),
                        (["--family", "gemv", "--alone", "2", "--alone-from", str(out / "route.json" if summary["chosen"]
                                                                                 else tmp_path / "on.json")],
                         "not a summary of products timed alone")):
        done = _run([*cmd, *flags, "--on", str(tmp_path / "on.json"), "--out", str(tmp_path / "again")])
        assert done.returncode == 2 and said in done.stderr and not (tmp_path / "again").exists(), flags
