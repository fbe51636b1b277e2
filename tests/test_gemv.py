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
from boltbeam.read.census import take_census
from boltbeam.route import choose, layout
from boltbeam.route.gemv import Geometry
from boltbeam.search.future import Calibration
from tests.test_families import blocks, reference
from tests.test_profile import profile, refuses, refuses_routes

ROWS, COLS = 64, 1024
# Each knob at more than one value, loads of every width, and rows a thread of every count.
GEOMETRIES = [Geometry(1, 1, 1, 4), Geometry(8, 4, 2, 16), Geometry(2, 16, 4, 8), Geometry(32, 1, 1, 16),
              Geometry(4, 8, 2, 4)]


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


def test_bubblebeam_keeps_the_geometries_the_chips_facts_allow():
    h200 = get_target("h200")
    legal, rejected = choose.GEMV.space(h200)
    assert legal and all(g.lanes_per_row * g.rows_per_group % 32 == 0 for g in legal)
    assert all(g.lanes_per_row * g.rows_per_group <= 1024 for g in legal)
    assert rejected["thread_group_width: partial thread groups leave lanes idle"] > 0
    assert len(legal) + sum(rejected.values()) == 6 * 6 * 3 * 3
    # A chip that declares no thread-group width gets no geometry, and says which fact it lacks.
    from tests.test_search import CPU_TARGETS
    cpu = get_target("host-like", [CPU_TARGETS])
    legal, rejected = choose.GEMV.space(cpu)
    assert not legal and rejected and all(why.startswith("the target declares no ") for why in rejected)
    with pytest.raises(BadInput, match="no setting of gemv is legal there"):
        choose.legal_space(choose.GEMV, cpu)


def test_futuresight_predicts_geometries_on_the_routes_products(tiny_model):
    from boltbeam.measure.route import Route
    census = take_census(tiny_model)
    h200, cal = get_target("h200"), Calibration(bandwidth_fraction={"generated_kernel": 0.3})
    on = Route(None, "t", "CUDA", "h200", "repacked_layout", "generated by search", [],
               layout={"scale_dtype": "float16", "form": "kernel", "stack": "stacked"})
    with pytest.raises(BadInput, match="layout form is kernel"):
        choose.gemv_prediction(census, Geometry(8, 4, 1, 16), 0, h200, cal,
                               dataclasses.replace(on, layout={**on.layout, "form": "expanded"}))
    sight = {g.flag: choose.gemv_prediction(census, g, 0, h200, cal, on) for g in choose.GEMV.space(h200)[0]}
    # The same bytes whatever the geometry: the layout's planes, as the layout family counts them.
    layout_bytes = choose.predicted_bytes(census, layout.Setting("float16", "kernel", "stacked"))
    untaken = sum(t.bytes_per_token for t in census.tensors if not choose._taken(t) and not t.tied)
    assert {s.bytes for s in sight.values()} == {layout_bytes - untaken}
    # Little's law: more bytes in flight a thread (wider loads, more rows a thread) is never predicted slower.
    assert sight["8:4:1:16"].memory_us <= sight["8:4:1:4"].memory_us
    assert sight["8:4:4:16"].memory_us <= sight["8:4:1:16"].memory_us
    # A product whose rows a geometry does not divide is predicted at the generated kernel's measured rate.
    rows = {p.rows for p in choose.layout_products(census, layout.Setting(**on.layout))}
    odd = next((g for g in choose.GEMV.space(h200)[0] if any(r % (g.rows_per_group * g.rows_per_thread) for r in rows)), None)
    if odd is not None:
        assert "measured generated_kernel" in sight[odd.flag].terms


def test_profile_with_a_geometry_on_cpu(tiny_model, tmp_path, capsys):
    default = profile(tiny_model, tmp_path / "default.json", "--context", "4", "--tokens", "2")
    geo = profile(tiny_model, tmp_path / "gemv.json", "--context", "4", "--tokens", "2",
                  "--layout", "float32:kernel", "--gemv", "1:32:2:16")
    fam = geo.route["settings"]["families"]["gemv-geometry"]
    assert geo.route["label"] == "generated-layout + gemv-geometry + tinygrad-scheduler"
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


def test_search_judges_geometries_on_a_kernel_form_route(tiny_model, tmp_path):
    """search --family gemv --on ROUTE: BubbleBeam's legal geometries in FutureSight's order, the best
    judged whole against the route without them; the route it writes keeps the layout and the geometry."""
    from boltbeam.files import sha256_file
    from boltbeam.measure import route as routes
    from tests.test_search import _ok, _run
    threads = tmp_path / "threads.toml"     # a CPU described with thread groups, so some geometry is legal
    threads.write_text("\n".join(
        ["[cpu-with-groups]"] + [f'{k} = {{ value = {v}, unit = "{u}", status = "spec", source = "test", date = "2026-12-01" }}'
                                 for k, v, u in (("memory_bandwidth", 2.0e10, "B/s"), ("thread_group_width", 32, "threads"),
                                                 ("max_threads_per_group", 1024, "threads"),
                                                 ("local_memory_per_group", 65536, "B"))]) + "\n")
    on = routes.Route(sha256_file(tiny_model), routes.engine(), "CPU", "cpu-with-groups", "repacked_layout",
                      "generated by search", [], layout={"scale_dtype": "float32", "form": "kernel", "stack": "stacked"})
    routes.save(on, tmp_path / "on.json")
    out, ledger = tmp_path / "gemv", tmp_path / "ledger.sqlite"
    cmd = [sys.executable, "-m", "boltbeam", "search", tiny_model, "--device", "CPU", "--target", "cpu-with-groups",
           "--targets", str(threads), "--family", "gemv", "--context", "4", "--tokens", "5", "--ledger", str(ledger),
           "--budget", "1", "--json"]
    summary = json.loads(_ok(_run([*cmd, "--on", str(tmp_path / "on.json"), "--out", str(out)])).stdout)
    legal, rejected = choose.GEMV.space(get_target("cpu-with-groups", [str(threads)]))
    assert len(summary["candidates"]) == len(legal) and summary["rejected_by_reason"] == dict(rejected)
    cands = summary["candidates"]
    assert [c["predicted_us"] for c in cands] == sorted(c["predicted_us"] for c in cands)
    judged = [c for c in cands if not c["skipped"]]
    assert judged == cands[:1] and judged[0]["verdict"] in VERDICTS
    from boltbeam.measure import trace as tracefile
    ran = tracefile.load(str(out / f"gemv_{judged[0]['setting'].replace(':', '_')}.json"))
    assert ran.route["label"] == "generated-layout + gemv-geometry + boltbeam-search"
    if summary["chosen"]:
        route = routes.load(str(out / "route.json"))
        assert route.layout == on.layout and Geometry(**route.gemv).flag == summary["chosen"]
    # Not on a route whose layout runs tensor code, nor on a route that already sets a geometry.
    routes.save(dataclasses.replace(on, layout={**on.layout, "form": "expanded"}), tmp_path / "expanded.json")
    routes.save(dataclasses.replace(on, gemv={"lanes_per_row": 1, "rows_per_group": 32, "rows_per_thread": 1,
                                              "load_bytes": 4}), tmp_path / "set.json")
    for route, said in (("expanded.json", "layout form is kernel"), ("set.json", "already sets gemv")):
        done = _run([*cmd, "--on", str(tmp_path / route), "--out", str(tmp_path / "again")])
        assert done.returncode == 2 and said in done.stderr and not (tmp_path / "again").exists(), route
