"""Generated route families on CPU. The repacked layout: generated from formats.toml's description of
each format, checked against tinygrad's own decode (the default route's math) for every format it
takes. Constants once: tensors that read nothing, found by that fact and computed once."""
import dataclasses
import json
from pathlib import Path
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from boltbeam.bound.roofline import formats
from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.judge.verdicts import VERDICTS
from boltbeam.measure import trace as tracefile
from boltbeam.read.census import take_census
from boltbeam.account.tieout import account
from boltbeam.bound.roofline import bound
from boltbeam.bound.targets import get_target
from boltbeam.route import constants, layout
from boltbeam.foresight.future import PER_KERNEL_FACT, Calibration
from tests.processes import DEPTH, profile
from tests.test_profile import refuses, refuses_routes

ROWS, COLS = 8, 512


def blocks(fmt: str, rng, rows: int = ROWS, cols: int = COLS):
    from tinygrad import Tensor
    elements, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    b = np.frombuffer(rng.bytes(rows * cols // elements * size), np.uint8).reshape(-1, size).copy()
    for off in formats()[fmt]["half_fields"]:     # finite scales of either sign
        b[:, off:off + 2] = rng.uniform(-1e-2, 1e-2, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return Tensor(b)


def reference(b, fmt: str, rows: int = ROWS, cols: int = COLS) -> np.ndarray:
    from tinygrad.llm.gguf import ggml_data_to_tensor
    return ggml_data_to_tensor(b.flatten(), rows * cols, GGMLQuantizationType[fmt].value).reshape(rows, cols).numpy()


def test_every_format_the_models_use_has_the_family():
    assert {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"} <= set(layout.formats_with_layout())
    for fmt in layout.formats_with_layout():
        assert "repacked-layout" in formats()[fmt]["routes"]
    from boltbeam.foresight.space import families
    fam = families()[layout.SPACE]        # its knobs live in spaces.toml, beside the searched families
    assert fam.expressed_by == "generated-layout" and set(fam.parameters) == {"scale_bytes", "form", "stacked"}


@pytest.mark.parametrize("fmt", layout.formats_with_layout())
def test_repacked_weights_and_products_equal_tinygrads_decode(fmt):
    rng = np.random.default_rng(7)
    b = blocks(fmt, rng)
    ref = reference(b, fmt)
    x = rng.standard_normal(COLS).astype(np.float32)
    from tinygrad import Tensor
    xt = Tensor(x).reshape(1, 1, COLS)
    for scale_dtype, tol in (("float32", 1e-6), ("float16", 2 ** -10)):
        p = layout.repack(b, fmt, ROWS, COLS, scale_dtype)
        w = p.weights().numpy()
        # float32 scales reproduce the decode (to the last bits of the fp32 products); float16 scales
        # round each group's scale and offset once, as the default route rounds every weight to fp16.
        assert np.abs(w - ref).max() <= tol * np.abs(ref).max(), (fmt, scale_dtype)
        for form in layout.FORMS:
            y = p.gemv(xt, form).numpy().ravel()
            assert np.abs(y - ref @ x).max() <= max(tol, 1e-5) * np.abs(ref @ x).max(), (fmt, scale_dtype, form)
    values = layout.values_of(fmt)
    assert p.low.shape == ((ROWS, COLS) if values.bits == 8 else (ROWS, COLS // 2))
    assert (p.high is None) == (values.bits in (4, 8))


def test_zero_point_replaces_the_offset_plane_only_where_it_is_exact():
    rng = np.random.default_rng(1)
    q4_0 = layout.repack(blocks("Q4_0", rng), "Q4_0", ROWS, COLS)
    assert q4_0.offset is None and q4_0.zero == 8
    q4_1 = layout.repack(blocks("Q4_1", rng), "Q4_1", ROWS, COLS)
    assert q4_1.offset is not None and q4_1.zero == 0
    # A legacy format with float16 scales moves exactly its GGUF bytes, rearranged.
    assert q4_0.nbytes == ROWS * COLS // 32 * 18 and q4_1.nbytes == ROWS * COLS // 32 * 20


def test_a_wrong_description_is_caught_by_the_decode_check(monkeypatch):
    rng = np.random.default_rng(2)
    b = blocks("Q4_0", rng)
    right = layout.values_of("Q4_0")
    # Offsets and scales are read off each group's first element, so a group that spans two blocks
    # gives the second block the first one's scale.
    wrong = layout.Values(right.bits, 2 * right.group, right.signed, right.fields)
    monkeypatch.setattr(layout, "values_of", lambda fmt: wrong)
    w = layout.repack(b, "Q4_0", ROWS, COLS).weights().numpy()
    assert np.abs(w - reference(b, "Q4_0")).max() > 1e-3 * np.abs(reference(b, "Q4_0")).max()


def test_rows_the_loader_reordered_are_followed():
    from tinygrad import Tensor
    rng = np.random.default_rng(3)
    p = layout.repack(blocks("Q4_K", rng, rows=64), "Q4_K", 64, COLS, "float32")
    order = rng.permutation(64)
    ref = Tensor(p.weights().numpy()[order])
    assert not layout._matches(p, ref)
    moved = layout._reordered(p, ref)
    assert moved is not None and np.array_equal(moved.weights().numpy(), ref.numpy())
    assert layout._reordered(p, Tensor(rng.standard_normal((64, COLS)).astype(np.float32))) is None


def test_non_finite_scales_repack_without_a_crash_and_never_match():
    from tinygrad import Tensor
    rng = np.random.default_rng(4)
    b = blocks("Q4_0", rng).numpy()
    b[:, 0:2] = np.full(len(b), np.nan, np.float16).view(np.uint8).reshape(-1, 2)     # hostile: NaN scales
    p = layout.repack(Tensor(b), "Q4_0", ROWS, COLS)
    assert p.offset is not None                          # no zero point read off NaNs
    assert not layout._matches(p, Tensor(reference(Tensor(b), "Q4_0")))   # install keeps the default route


def test_weights_repacked_together_are_the_planes_each_gives_alone():
    """layout.repack_all (install repacks its layers so, realizing and reading them together): the same planes,
    zero points and matches as each weight repacked and checked alone, a NaN-scaled weight among them."""
    from tinygrad import Tensor
    rng = np.random.default_rng(5)
    hostile = blocks("Q4_0", rng).numpy()
    hostile[:, 0:2] = np.full(len(hostile), np.nan, np.float16).view(np.uint8).reshape(-1, 2)
    # an offset plane (Q4_K), a high plane (Q6_K), signed values (Q8_0) and a zero point (Q4_0)
    weights = [(blocks(fmt, rng), fmt, ROWS, COLS) for fmt in ("Q4_K", "Q6_K", "Q8_0", "Q4_0")]
    weights.append((Tensor(hostile), "Q4_0", ROWS, COLS))
    together = layout.repack_all(weights)
    alone = [layout.repack(*w) for w in weights]
    for a, b in zip(together, alone):
        assert a.zero == b.zero and len(a.tensors()) == len(b.tensors())
        assert all(np.array_equal(x.numpy(), y.numpy(), equal_nan=True) for x, y in zip(a.tensors(), b.tensors()))
    refs = [Tensor(reference(b, fmt)) for b, fmt, _, _ in weights]
    refs[0] = refs[0].flip(0)                                           # a weight whose rows moved: no match
    assert layout._all_match(list(zip(together, refs))) == [layout._matches(p, r) for p, r in zip(alone, refs)]
    assert layout._all_match(list(zip(together, refs)))[1:-1] == [True] * (len(weights) - 2)


def test_matrices_are_repacked_in_runs_of_one_blocks_in_the_files_order():
    """install repacks a block's matrices together (tinygrad's schedule cache then takes every block after the first),
    and never out of the file's order: the planes go back to their layers by position."""
    from types import SimpleNamespace
    order = [(None, "token_embd"), (0, "q"), (0, "k"), (1, "q"), (0, "v"), (None, "output"), (None, "head")]
    runs = layout._by_block([(SimpleNamespace(block=b), name, None) for b, name in order])
    assert [[m[1] for m in run] for run in runs] == [["token_embd"], ["q", "k"], ["q"], ["v"], ["output"], ["head"]]


def test_a_format_without_a_description_is_search_space_incomplete():
    from tinygrad import Tensor
    with pytest.raises(BadInput, match="search-space-incomplete"):
        layout.repack(Tensor.zeros(2, 176).cast("uint8"), "Q5_K", 1, 512)
    with pytest.raises(BadInput, match="scale_dtype"):
        layout.Setting("bfloat8", "expanded")


def test_constants_are_found_by_what_they_read():
    from tinygrad import Tensor, UOp
    table = (Tensor.arange(16).float() * 0.5).sin().contiguous()
    assert constants.is_constant(table)
    weights = Tensor.ones(16).contiguous().realize()
    assert not constants.is_constant(weights * 2) and not constants.is_constant(weights)
    pos = UOp.variable("pos", 0, 15)
    assert not constants.is_constant(Tensor.arange(16).float()[pos.bind(3)] + 1)


@pytest.fixture(scope="module")
def constants_search(tiny_model, tiny_default, shared):
    """`search --family constants_once` at DEPTH against the shared default trace, made once a run: its folder
    and summary. Its one candidate's profile (`profile --constants-once`, in a process of its own) is also the
    constants-once trace the families' profile test reads."""
    from tests.processes import once
    from tests.test_search import _ok, _run, whole_search_cmd
    out = shared / "constants_once"
    cmd = [*whole_search_cmd(tiny_model, "constants_once", shared / "constants_once.sqlite"),
           "--baseline", str(tiny_default.path), "--out", str(out)]
    made = once(shared / "constants_once.json", lambda path: path.write_text(_ok(_run(cmd)).stdout))
    return out, json.loads(made.read_text())


def test_profile_with_the_families_on_cpu(tiny_model, profiled, tiny_default, kernel_form, constants_search):
    _, searched = constants_search
    paths = {"default": tiny_default.path, "layout": profiled(tiny_model, *DEPTH, "--layout", "float32:expanded"),
             "once": searched["candidates"][0]["trace"],
             "stacked": kernel_form.path}      # stacked: the generated kernel, on stacked planes
    default, routed, once, stacked = (tracefile.load(paths[n]) for n in ("default", "layout", "once", "stacked"))
    lay = routed.route.settings["families"]["generated-layout"]
    assert routed.route.label == "generated-layout + tinygrad-scheduler"
    assert lay["applied"] == lay["eligible"] > 0 and lay["form"] == "expanded" and lay["bytes"] > 0
    # The same greedy tokens, and every weight role still found: the classifier follows the new planes.
    assert routed.output_tokens == default.output_tokens == once.output_tokens == stacked.output_tokens
    assert stacked.route.label == "generated-layout + boltbeam-search"      # built from a route file's layout
    roles = lambda t: sorted(k.role for k in t.kernels_of_token(0) if k.category == "weights")
    assert roles(routed) == roles(default) == roles(once)
    # Stacked: one product a block for gate and up (and for the query and key), named by every tensor it
    # reads, so every weight the separate route reads is still found, in fewer kernels.
    products = lambda t: [set(k.tensors) for k in t.kernels_of_token(0) if k.category == "weights"]
    names = lambda t: set().union(*products(t)) - {n for n in set().union(*products(t)) if "norm" in n}
    assert names(stacked) == names(routed) and len(products(stacked)) < len(products(routed))
    census = take_census(tiny_model)
    for b in range(census.facts.blocks):
        assert any({f"blk.{b}.ffn_gate.weight", f"blk.{b}.ffn_up.weight"} <= p for p in products(stacked))
        assert any({f"blk.{b}.attn_q.weight", f"blk.{b}.attn_k.weight"} <= p for p in products(stacked))
    assert {k: stacked.route.settings["families"]["generated-layout"][k] for k in ("form", "stack")} == \
        {"form": "kernel", "stack": "stacked"}
    assert all(k.name.startswith("gemv_planes") for k in stacked.kernels_of_token(0)
               if k.category == "weights" and k.role != "token_embd")
    # The default route recomputes the rotary table every token: kernels that read no buffer. The
    # account names that cause with the bytes; constants-once leaves no such kernel.
    made = [k for k in default.kernels_of_token(0) if k.category == "constant"]
    assert made and all(k.reads_buffers == 0 and k.writes_bytes > 0 for k in made)
    h200 = get_target("h200")
    acc = account(default, bound(take_census(tiny_model), h200, context=default.workload.context, batch=1), h200)
    line = next(line for line in acc.lines if line.cause == "constant")
    assert f"write {sum(k.writes_bytes for k in made):,} B" in line.detail and line.kernels == len(made)
    assert once.route.label == "constants-once + tinygrad-scheduler"
    assert once.route.settings["families"]["constants-once"]["applied"] >= 1
    assert not any(k.category == "constant" for k in once.kernels_of_token(0))
    # What the layout's products reached of the bandwidth, by who wrote them: FutureSight's measured term.
    from boltbeam.search.choose import measured_fraction
    host = get_target("host")
    written = {measured_fraction(str(paths[f]), host)[0] for f in ("layout", "stacked")}
    assert written == {"tensor_code", "generated_kernel"}
    assert 0 < measured_fraction(str(paths["layout"]), host)[1] < 1   # a CPU's gemv: under its bandwidth
    with pytest.raises(BadInput, match="ran no layout"):
        measured_fraction(str(paths["default"]), host)
    assert main(["search-calibrate", "--target", "host", "--json", "--layout-trace", str(paths["layout"]),
                 "--layout-trace", str(paths["stacked"])]) == 0


def test_bad_layout_flags_and_route_layouts(tiny_model, tmp_path, capsys):
    refuses(tiny_model, tmp_path, capsys, ["--layout", "float16"], "SCALES:FORM")
    refuses(tiny_model, tmp_path, capsys, ["--layout", "float16:sideways"], "form one of")
    refuses_routes(tiny_model, tmp_path, capsys, {"family": "tinygrad_opts"}, "layout",
                   (({"scale_dtype": "float16", "shape": "square"}, "expected the keys scale_dtype, form"),))


def test_search_on_the_families_writes_a_route_that_rebuilds_them(tiny_model, tmp_path):
    """The search times the kernels of the token as the families make it; its route carries the families,
    so a fresh process rebuilds them and every kernel the search timed is found again. Which kernels beat
    their default by the noise margin is a race on a CPU's microsecond kernels, so the route replayed here
    names every kernel the search timed (each with no opts), not only the ones it chose."""
    from tests.test_search import _ok, _run, search_cmd
    out = tmp_path / "search"
    summary = json.loads(_ok(_run(search_cmd(tiny_model, out, tmp_path / "ledger.sqlite", "--budget", "1", "--no-judge",
                                             "--layout", "float32:expanded", "--constants-once"))).stdout)
    route = json.loads((out / "route.json").read_text())
    assert route["layout"] == {"scale_dtype": "float32", "form": "expanded", "stack": "separate"} and route["constants_once"] is True
    timed = summary["per_kernel"]
    assert len(timed) > 10 and {c["kernel"] for c in route["choices"]} <= {k["kernel"] for k in timed}
    no_opts = {"local": 1, "group": 1, "upcast": 1, "unroll": 1, "group_axis": 0, "unroll_axis": 0}
    every = {**route, "choices": [{"kernel": k["kernel"], "name": k["name"], "setting": no_opts, "opts": [],
                                   "measured_us": k["default_us"], "default_us": k["default_us"], "predicted_us": None}
                                  for k in timed]}
    (tmp_path / "every.json").write_text(json.dumps(every))
    routed = profile(tiny_model, tmp_path / "routed.json", "--context", "8", "--tokens", "2", "--route", str(tmp_path / "every.json"))
    assert routed.route.label == "generated-layout + constants-once + boltbeam-search"
    assert routed.route.settings["kernels_applied"] == len(timed)


def test_futuresight_orders_layout_settings_by_the_bytes_they_read(tiny_model):
    from boltbeam.search import choose
    census = take_census(tiny_model)
    h200 = get_target("h200")
    every, rejected = choose.space(layout.FAMILY, h200)      # no rule in chip facts: every setting is legal
    flags = [s.flag for s in every]
    assert not rejected
    assert sorted(flags) == sorted(f"{d}:{f}{st}" for d in ("float16", "float32") for f in ("expanded", "factored", "kernel")
                                   for st in ("", ":stacked"))
    assert [layout.Setting.parse(f).flag for f in flags] == flags
    b = {f: layout.predicted_bytes(census, s) for f, s in zip(flags, every)}
    assert b["float16:expanded"] < b["float32:expanded"] < b["float32:factored"]
    assert b["float16:expanded"] < b["float16:factored"] and b["float16:expanded"] == b["float16:expanded:stacked"]
    assert b["float16:kernel"] == b["float16:expanded"]      # the generated kernel writes no partial sums
    assert layout.predicted_products(census, layout.Setting("float16", "kernel")) == \
        layout.predicted_products(census, layout.Setting("float16", "expanded"))
    # Stacking reads the same bytes in fewer products: each block's stacks (query and key of one format;
    # gate and up) launch one kernel each; a target's measured cost a kernel then orders them.
    separate, stacked = (layout.predicted_products(census, layout.Setting("float16", "expanded", st))
                         for st in layout.STACKS)
    blocks = census.facts.blocks
    assert stacked < separate and separate - stacked >= 2 * blocks
    unmeasured, measured = Calibration(), Calibration(bandwidth_fraction={"tensor_code": 0.2, "generated_kernel": 0.3})
    us = {f: layout.FAMILY.foresee(census, s, 0, h200, unmeasured).us(h200) for f, s in zip(flags, every)}
    per_kernel = h200.fact(PER_KERNEL_FACT) * 1e6
    assert us["float16:expanded"] - us["float16:expanded:stacked"] == pytest.approx((separate - stacked) * per_kernel)
    # Unmeasured, the kernel form ties with the expanded one (the same bytes and products); measured, the
    # writer that reached more of the bandwidth goes first, by the ratio of the fractions.
    assert us["float16:kernel"] == us["float16:expanded"]
    assert set(layout.WRITTEN_BY) == set(layout.FORMS)
    sight = {f: layout.FAMILY.foresee(census, s, 0, h200, measured) for f, s in zip(flags, every)}
    assert sight["float16:kernel"].memory_us * 0.3 == pytest.approx(sight["float16:expanded"].memory_us * 0.2)
    assert min(sight, key=lambda f: sight[f].us(h200)) == "float16:kernel:stacked"
    assert (sight["float16:kernel"].fraction, sight["float16:kernel"].terms) == (0.3, ("bandwidth", "measured generated_kernel"))
    # A target with no measured cost of a kernel prices kernels at nothing: stacked and separate tie, and the
    # search judges the one of fewer kernels first (though it changes one knob more from a route without a layout).
    unpriced = dataclasses.replace(h200, facts={k: f for k, f in h200.facts.items() if k != PER_KERNEL_FACT})
    ranked = [c.setting.flag for c in choose.foreseen(layout.FAMILY, census, 0, unpriced)[0]]
    assert ranked[:2] == ["float16:kernel:stacked", "float16:kernel"]
    # A scale and an offset per group: float32 ones cost 4 bytes more a group than float16 ones.
    taken = [t for t in census.tensors if layout.values_of(t.format) and len(t.shape) == 2
             and t.role not in (None, "token_embd")]
    groups = sum(t.elements // layout.values_of(t.format).group for t in taken)
    assert taken and b["float32:expanded"] - b["float16:expanded"] == 4 * groups


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_burst_local_memory_counts_the_caches_values(dtype, monkeypatch):
    """Burst holds a chunk's values in local memory in the cache's type (tinygrad.llm's float32; half_cache's
    float16): a chunk that fits only at two bytes a value is refused on a float32 cache, in one line, before any
    kernel is built. Built where tinygrad.llm builds it: inside a block traced as a function, where tinygrad forbids
    opening a device (the H100's first burst profile failed there)."""
    from tinygrad import Device, Tensor, UOp, dtypes
    from tinygrad.helpers import Context
    from boltbeam.route import attention
    kv_heads, group, head_dim, positions, chunk = 1, 2, 16, 32, 16
    halves, floats = (attention.burst_local_bytes(group, head_dim, chunk, b) for b in (2, 4))
    monkeypatch.setattr(Device["CPU"].renderer, "shared_max", (halves + floats) // 2)
    cache = Tensor.empty(2, 1, kv_heads, positions, head_dim, dtype=dtypes.float16 if dtype == "float16" else dtypes.float32,
                         device="CPU")
    p = UOp.variable("start_pos", 0, positions - 1).bind(20)
    written = Tensor(cache.uop.after(cache[:, :, :, p:p + 1, :].uop.store(cache[:, :, :, 0:1, :].contiguous().uop)))
    q = Tensor.empty(1, kv_heads * group, 1, head_dim, device="CPU")

    def build():
        with Context(ALLOW_DEVICE_USAGE=0):       # as tinygrad's function.py traces a block
            attention.decode_kernels(q, written[0, :, :, 0:p + 1, :], chunk, burst=True)
    if dtype == "float32":
        with pytest.raises(BadInput, match=f"holds {floats} bytes of local memory .* a cache of 4-byte values.*allows"):
            build()
    else:
        build()


def test_futuresight_on_split_attention_settings(tiny_model):
    """The cache read by whole chunks (more padding with longer chunks) and the kernels the compiler
    schedules (two more a block when staged)."""
    from boltbeam.route import attention, split_attention
    from boltbeam.search import choose
    census = take_census(tiny_model)
    f = census.facts
    row = f.kv_heads * (f.head_dim + f.value_dim) * split_attention.KV_BYTES
    h200, cal = get_target("h200"), Calibration()
    chunks = (16, 32, 64, 128, 256)
    legal, rejected = choose.space(split_attention.FAMILY, h200)
    assert {s.flag for s in legal} == {f"{c}{st}{ca}" for c in chunks for st in ("", ":staged") for ca in ("", ":carried")} \
        | {f"{c}:kernel{w}{r}" for c in chunks for w in ("", ":wide", ":lanes", ":burst")
           for r in ("", ":rotary", ":rotary:pooled")} \
        | {f"{c}:kernel{w}{r}" for c in chunks[:-1] for w in (":wide:unrolled", ":unrolled:lanes", ":unrolled:burst")
           for r in ("", ":rotary", ":rotary:pooled")}
    # unrolled, a thread holds a chunk's loads of values at once: 256 positions are more than its 255 registers
    assert any("registers_per_thread" in why for why in rejected)
    # The generated kernel runs thread groups: a target that declares none gets the tensor code only.
    host = get_target("host-like", [str(Path(__file__).parent / "data" / "cpu_target.toml")])
    settings, rejected = choose.space(split_attention.FAMILY, host)
    assert not any(s.kernel for s in settings) and len(settings) == 20
    # (the kernel half of the 5 x 2^9 value sets; and the registers rule)
    assert rejected["the target declares no max_threads_per_group"] == 1280 and len(rejected) == 2
    unstaged = split_attention.foresee(census, attention.Split(32), 40, h200, cal)      # 41 positions: 2 chunks of 32
    assert unstaged.bytes == f.blocks * 64 * row
    staged = split_attention.foresee(census, attention.Split(32, True), 40, h200, cal)
    assert (staged.bytes, staged.kernels) == (unstaged.bytes, unstaged.kernels + 2 * f.blocks)
    assert split_attention.foresee(census, attention.Split(16), 40, h200, cal).bytes == f.blocks * 48 * row
    # Unstaged, the values are read by the combine, one output per head and dimension; staged, by a
    # kernel with an output per chunk besides: more in flight (Little's law), so less time moving them.
    readers = lambda st: [k.outputs for k in attention.scheduled(attention.Split(32, st), f.heads, f.kv_heads,
                                                                 f.head_dim, 64, 40) if k.reads_cache]
    assert readers(False)[-1] == f.heads * f.head_dim and readers(True)[-1] == 2 * f.heads * f.head_dim
    assert "little's law" in staged.terms and staged.memory_us < unstaged.memory_us
    # Carried, each chunk's sum rides with its weighted values and the denominator with the combine's
    # output: two reductions fewer a block, one division more; the same cache read.
    carried = split_attention.foresee(census, attention.Split(32, True, True), 40, h200, cal)
    assert (carried.bytes, carried.kernels) == (staged.bytes, staged.kernels - f.blocks)
    # Generated: two kernels a block (partials, combine), whose loads stop at the position (41 of the two
    # chunks' 64), the partials a thread for each query head and position of the chunks so far.
    kernel = split_attention.foresee(census, attention.Split(32, kernel=True), 40, h200, cal)
    assert (kernel.bytes, kernel.kernels) == (f.blocks * 41 * row, 2 * f.blocks)
    assert attention.scheduled(attention.Split(32, kernel=True), f.heads, f.kv_heads, f.head_dim, 64, 40) == (
        attention.Scheduled(f.heads * 2 * 32, True), attention.Scheduled(f.heads * f.head_dim, False))
    # Wide, the same bytes and kernels, each load WIDE_KEYS values: more in flight a thread (Little's law).
    wide = split_attention.foresee(census, attention.Split(32, kernel=True, wide=True), 40, h200, cal)
    assert (wide.bytes, wide.kernels) == (kernel.bytes, kernel.kernels) and wide.memory_us < kernel.memory_us
    # Unrolled, a thread's whole key row in flight at once.
    unrolled = split_attention.foresee(census, attention.Split(32, kernel=True, wide=True, unrolled=True), 40, h200, cal)
    assert (unrolled.bytes, unrolled.kernels) == (wide.bytes, wide.kernels) and unrolled.memory_us < wide.memory_us
    with pytest.raises(BadInput, match="unrolled its wide, lanes or burst form"):
        attention.Split(32, kernel=True, unrolled=True)
    assert attention.Split.parse("32:kernel:wide:unrolled") == attention.Split(32, kernel=True, wide=True, unrolled=True)
    # Lanes: a thread for each query head and dimension (head size / chunk threads a key row), the combine four
    # threads a dimension; more threads, each with a run of chunk keys in flight.
    lanes = attention.Split(16, kernel=True, lanes=True)
    assert attention.scheduled(lanes, f.heads, f.kv_heads, f.head_dim, 64, 40) == (
        attention.Scheduled(f.heads * 3 * f.head_dim, True), attention.Scheduled(f.heads * f.head_dim * 4, False))
    sight = split_attention.foresee(census, lanes, 40, h200, cal)
    wide16 = split_attention.foresee(census, attention.Split(16, kernel=True, wide=True), 40, h200, cal)
    assert (sight.bytes, sight.kernels) == (wide16.bytes, wide16.kernels) and sight.memory_us < wide16.memory_us
    assert attention.Split.parse("16:kernel:lanes") == lanes
    # Burst's combine: a lane for each chunk of the cache, 32 at most.
    burst = attention.Split(16, kernel=True, burst=True)
    assert [attention.scheduled(burst, f.heads, f.kv_heads, f.head_dim, positions, 40)[1].outputs
            for positions in (64, 640)] == [f.heads * f.head_dim * 4, f.heads * f.head_dim * 32]
    for flag in ("16:kernel:wide:lanes", "16:lanes"):
        with pytest.raises(BadInput, match="one of them"):
            attention.Split.parse(flag)
    # A chunk longer than the head (or not a run of whole loads) is the model's to rule out, not the chip's.
    assert split_attention.FAMILY.unfit(census, lanes) is None and split_attention.FAMILY.unfit(census, attention.Split(16)) is None
    longer = attention.Split(2 * f.head_dim, kernel=True, lanes=True)
    assert "multiple of the chunk" in split_attention.FAMILY.unfit(census, longer)
    from tinygrad import Tensor
    with pytest.raises(BadInput, match="multiple of the chunk"):     # before the kernels are built
        attention.decode_kernels(Tensor.empty(1, 4, 1, 16), Tensor.empty(1, 2, 8, 16), 32, lanes=True)


def test_search_judges_each_layout_setting_whole_and_skips_what_the_ledger_refuted(tiny_model, tiny_default, tmp_path):
    from boltbeam.ledger.store import Ledger
    from boltbeam.measure.route import engine
    from tests.test_search import CPU_TARGETS, _ok, _run
    ledger = tmp_path / "ledger.sqlite"
    with Ledger(ledger) as led:     # an earlier verdict on one setting, valid until the compiler changes
        led.append(candidate="repacked_layout float32:factored", verdict="refute", reasons=["two kernels a product"],
                   scope={"setting": "float32:factored"}, evidence=[], reopen=f"engine!={engine()}", actor="test")
    out = tmp_path / "layout"
    base = tiny_default.path     # the default route at the search's depth, as the search would profile it
    done = _ok(_run([sys.executable, "-m", "boltbeam", "search", tiny_model, "--device", "CPU", "--target", "host-like",
                     "--targets", CPU_TARGETS, "--family", "repacked_layout", *DEPTH,
                     "--ledger", str(ledger), "--out", str(out), "--budget", "2", "--baseline", str(base), "--json"]))
    summary = json.loads(done.stdout)
    cands = summary["candidates"]
    assert [c["predicted_us"] for c in cands] == sorted(c["predicted_us"] for c in cands) and len(cands) == 12
    by_ledger = [c for c in cands if c["skipped"] and "two kernels a product" in c["skipped"]]
    assert [c["setting"] for c in by_ledger] == ["float32:factored"]
    # The budget: FutureSight's two best predicted settings the ledger does not hold are judged, no more.
    judged = [c for c in cands if not c["skipped"]]
    assert len(judged) == 2 and all("budget" in c["skipped"] for c in cands if c["skipped"] and c not in by_ledger)
    assert cands.index(judged[-1]) < min(cands.index(c) for c in cands if c["skipped"] and c not in by_ledger)
    assert all(c["verdict"] in VERDICTS and c["median_us"] > 0 for c in judged)
    with Ledger(ledger, create=False) as led:
        recorded = {e.scope.get("setting"): e for e in led.entries() if e.actor == "boltbeam search"}
    assert set(recorded) == {c["setting"] for c in judged}
    assert all(recorded[c["setting"]].verdict == c["verdict"] for c in judged)
    promoted = [c for c in judged if c["verdict"] == "promote"]
    assert (summary["chosen"] is None) == (not promoted) and (out / "route.json").exists() == bool(promoted)
    if promoted:
        route = json.loads((out / "route.json").read_text())
        assert layout.Setting(**route["layout"]).flag == summary["chosen"] and route["beam"] == 0


def test_one_switch_turns_every_generated_family_off(monkeypatch):
    from boltbeam.route.families import Flags, installers, settings
    chosen = settings(None, Flags(layout="float16:expanded", constants_once=True))
    assert len(installers(chosen)) == 2
    monkeypatch.setenv("BOLTBEAM_ROUTE", "none")
    assert installers(chosen) == []


@pytest.mark.parametrize("kv_heads, group, head_dim, total, chunk", [
    (2, 2, 16, 64, 8),
    (3, 3, 64, 512, 32),     # the shape that sent tinygrad's code generator into endless recursion before
    (8, 4, 128, 512, 128),
])
@pytest.mark.parametrize("staged, carried", [(False, False), (True, False), (True, True), (False, True)])
def test_split_attention_equals_tinygrads_attention(kv_heads, group, head_dim, total, chunk, staged, carried):
    """One query position over a cache whose length is a JIT variable: by chunks, then combined."""
    from tinygrad import Tensor, TinyJit, UOp
    from boltbeam.route.attention import split_sdpa
    cache = Tensor.randn(2, 1, kv_heads, total, head_dim).realize()
    pos = UOp.variable("start_pos", 0, total - 1)

    @TinyJit
    def split(q, p):
        return split_sdpa(q, cache[0, :, :, 0:p + 1], cache[1, :, :, 0:p + 1], chunk, total, staged, carried).realize()

    for p in (0, chunk - 1, chunk, total // 2 + 3, total - 1):   # first chunk, its edges, a partial chunk, all
        q = Tensor.randn(1, kv_heads * group, 1, head_dim).realize()
        got = split(q, pos.bind(p)).numpy()
        want = q.scaled_dot_product_attention(cache[0, :, :, 0:p + 1], cache[1, :, :, 0:p + 1], enable_gqa=True).numpy()
        assert np.abs(got - want).max() < 1e-5, p


@pytest.mark.parametrize("kv_heads, group, head_dim, positions, chunk, form", [
    (2, 2, 8, 24, 8, ""),
    (1, 4, 16, 20, 16, ""),              # the cache's last chunk runs past its end
    (2, 2, 16, 64, 32, ""),              # every output in one round: the threads past them write to a spill slot
    (2, 2, 16, 24, 8, "wide"),           # wide: a key row two loads of eight, each thread two dimensions of values
    (1, 4, 32, 20, 8, "wide"),           # four dimensions a thread; the last chunk past the cache's end
    (2, 2, 8, 40, 16, "wide"),           # a chunk wider than a head: half its threads take no dimension
    (1, 4, 32, 20, 8, "wide:unrolled"),  # unrolled: every load of a key row and of a chunk's values at once
    (2, 2, 8, 40, 16, "wide:unrolled"),
    (2, 2, 16, 24, 8, "lanes"),          # lanes: two threads a key row, a thread a query head's dimension
    (1, 4, 32, 20, 8, "lanes"),          # four threads a key row; the last chunk past the cache's end
    (2, 2, 16, 40, 16, "lanes"),         # one thread a key row; the combine's four lanes, some with no chunk
    (1, 2, 8, 264, 8, "lanes"),          # the combine: more chunks than threads (33 of 32), several a lane
    (2, 2, 32, 40, 8, "burst"),          # burst: a run of keys and one of values a thread; four threads a score
    (1, 4, 32, 20, 8, "burst"),          # more threads than runs (the rest load nothing); the last chunk past the end
    (2, 1, 16, 40, 16, "burst"),         # more runs than threads: two of each a thread
    (1, 3, 16, 40, 16, "unrolled:burst"),  # three query heads a key head; a chunk's loops written out
    (1, 2, 8, 328, 8, "burst"),          # the spread combine: more chunks than lanes (41 of 32), two for some
])
def test_generated_attention_kernels_equal_tinygrads_attention(kv_heads, group, head_dim, positions, chunk, form):
    """The two generated kernels (partials through local memory, then the combine), under the JIT with the
    position a variable and the cache written in the same graph, as tinygrad.llm's decode step does: on
    tinygrad's PYTHON device, which runs thread groups, local memory and barriers (and vector loads)."""
    from tinygrad import Tensor, TinyJit, UOp
    from boltbeam.route.attention import decode_kernels
    dev = "PYTHON"
    cache = Tensor.randn(2, 1, kv_heads, positions, head_dim, device=dev).realize()
    pos = UOp.variable("start_pos", 0, positions - 1)

    @TinyJit
    def step(q, x, p):
        written = Tensor(cache.uop.after(cache[:, :, :, p:p + 1, :].uop.store(x.uop)))
        return decode_kernels(q, written[0, :, :, 0:p + 1, :], chunk, "wide" in form, "unrolled" in form,
                              "lanes" in form, "burst" in form).realize()

    for p in (0, 1, chunk - 1, chunk, positions - 1):
        q = Tensor.randn(1, kv_heads * group, 1, head_dim, device=dev).realize()
        x = Tensor.randn(2, 1, kv_heads, 1, head_dim, device=dev).realize()
        got = step(q, x, pos.bind(p)).numpy()
        kv = cache.numpy()           # with this step's key and value written at p
        want = q.to("CPU").scaled_dot_product_attention(Tensor(kv[0, :, :, :p + 1]), Tensor(kv[1, :, :, :p + 1]),
                                                        enable_gqa=True).numpy()
        assert np.abs(got - want).max() < 1e-5, p


def test_staged_split_attention_keeps_the_chunks_an_output_axis():
    """Unstaged, the weighted values fuse into the combine, one reduction over every position; staged,
    no kernel reduces over both the chunks and the positions in a chunk."""
    from tinygrad import Tensor, UOp
    from tinygrad.uop.ops import AxisType, Ops
    from boltbeam.route.attention import split_sdpa
    cache = Tensor.randn(2, 1, 2, 128, 16).realize()
    p = UOp.variable("start_pos", 0, 127).bind(70)

    def kernels(staged: bool) -> list[list[int]]:
        """Each kernel's reduction lengths (a variable one as 0)."""
        q = Tensor.randn(1, 4, 1, 16).realize()
        out = split_sdpa(q, cache[0, :, :, 0:p + 1], cache[1, :, :, 0:p + 1], 16, 128, staged)
        reduces = []
        for call in out.linear_with_vars()[0].src:
            ranges = [u for u in call.src[0].toposort() if u.op is Ops.RANGE and u.arg[-1] is AxisType.REDUCE]
            reduces.append(sorted(int(r.src[0].arg) if r.src[0].op is Ops.CONST else 0 for r in ranges))
        return reduces

    fused, staged = kernels(False), kernels(True)
    assert len(staged) == len(fused) + 2
    over_all = lambda ks: [r for r in ks if 0 in r and 16 in r]     # the chunk count (variable) and a chunk's 16
    assert over_all(fused) and not over_all(staged)


def test_stacked_planes_give_each_layer_its_own_product():
    """Layers of one format stacked one above another: each layer's rows of the one product equal its
    own product, the bias added after; planes of another storage do not stack with them."""
    from tinygrad import Tensor
    rng = np.random.default_rng(3)
    parts = [layout.repack(blocks("Q4_K", rng, rows=r), "Q4_K", r, COLS) for r in (16, 8, 8)]
    stack = layout.stacked(parts)
    assert stack.rows == 32 and len({layout._stack_key(p) for p in parts}) == 1
    x = Tensor(rng.standard_normal((1, 1, COLS)).astype(np.float32))
    bias = Tensor(rng.standard_normal(8).astype(np.float32))
    start = 0
    for p, b in zip(parts, (None, bias, None)):
        rows = slice(start, start + p.rows)
        for form in layout.FORMS:
            got = layout.LayoutLinear(stack, b, form, rows)(x).numpy()
            want = layout.LayoutLinear(p, b, form)(x).numpy()
            assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        start += p.rows
    q6 = layout.repack(blocks("Q6_K", rng, rows=8), "Q6_K", 8, COLS)
    assert layout._stack_key(q6) != layout._stack_key(parts[0])


def test_search_refuses_a_baseline_of_another_route(tiny_model, tiny_default, tmp_path, capsys):
    """--baseline must be the default route at the search's depth and BEAM width: one line, nothing written."""
    from tests.test_search import CPU_TARGETS
    base = tiny_default.path
    out = tmp_path / "layout"
    cmd = ["search", tiny_model, "--device", "CPU", "--target", "host-like", "--targets", CPU_TARGETS, "--family",
           "repacked_layout", "--tokens", "5", "--ledger", str(tmp_path / "l.sqlite"), "--out", str(out), "--baseline", str(base)]
    assert main([*cmd, "--context", "8"]) == 2
    err = capsys.readouterr().err
    assert "context 4" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    assert main([*cmd, "--context", "4", "--beam", "2"]) == 2
    assert "BEAM width 0" in capsys.readouterr().err and not out.exists()
    assert main(["search", tiny_model, "--device", "CPU", "--target", "host-like", "--targets", CPU_TARGETS,
                 "--out", str(out), "--beam", "2"]) == 2
    assert "repacked_layout" in capsys.readouterr().err and not out.exists()


def test_split_attention_searched_on_a_route(tiny_model, kernel_form, tmp_path, capsys):
    """search --family split_attention --on ROUTE: each setting judged whole on top of the route's layout,
    against the route alone (the shared profile of it, which the search checks is that route's); a route
    that already splits attention is refused, and profile builds a route's split attention itself."""
    from boltbeam.measure import route as routes
    from boltbeam.route import attention
    from tests.test_search import CPU_TARGETS, _ok, _run
    on = routes.load(str(kernel_form.route))
    out, ledger = tmp_path / "split", tmp_path / "ledger.sqlite"
    cmd = [sys.executable, "-m", "boltbeam", "search", tiny_model, "--device", "CPU", "--target", "host-like",
           "--targets", CPU_TARGETS, "--family", "split_attention", *DEPTH,
           "--ledger", str(ledger), "--budget", "1", "--json"]
    summary = json.loads(_ok(_run([*cmd, "--on", str(kernel_form.route), "--baseline", str(kernel_form.path),
                                   "--out", str(out)])).stdout)
    judged = [c for c in summary["candidates"] if not c["skipped"]]
    assert len(summary["candidates"]) == 20 and len(judged) == 1 and judged[0]["verdict"] in VERDICTS
    assert judged[0] == summary["candidates"][0]            # FutureSight's first
    ran = tracefile.load(str(out / f"split_attention_{judged[0]['setting'].replace(':', '_')}.json"))
    assert ran.route.label == "generated-layout + split-attention + boltbeam-search"
    assert summary["baseline"] == str(kernel_form.path) and not (out / "baseline.json").exists()
    if summary["chosen"]:
        route = routes.load(str(out / "route.json"))
        assert route.families["layout"] == on.families["layout"]
        assert attention.Split(**route.families["split_attention"]).flag == summary["chosen"]
    # A route's BEAM width is the search's unless --beam says otherwise, as profile runs it: a baseline
    # made without BEAM is then refused.
    routes.save(dataclasses.replace(on, beam=2), tmp_path / "beam.json")
    done = _run([*cmd, "--on", str(tmp_path / "beam.json"), "--baseline", str(kernel_form.path), "--out", str(tmp_path / "b")])
    assert done.returncode == 2 and "BEAM width 0" in done.stderr and not (tmp_path / "b").exists()
    # A route that splits already (written before `carried`: off) is searched again: its own setting is the
    # baseline, not a candidate, and the candidate judged replaces it.
    split = dataclasses.replace(on, families={**on.families, "split_attention": {"chunk": 16, "staged": True}})
    routes.save(split, tmp_path / "split.json")
    again = json.loads(_ok(_run([*cmd, "--on", str(tmp_path / "split.json"), "--out", str(tmp_path / "again")])).stdout)
    own = [c for c in again["candidates"] if c["skipped"] == "the route's own setting: the baseline"]
    assert [c["setting"] for c in own] == ["16:staged"]
    (judged,) = [c for c in again["candidates"] if not c["skipped"]]
    assert judged["setting"] != "16:staged" and judged["verdict"] in VERDICTS
    ran = tracefile.load(str(tmp_path / "again" / f"split_attention_{judged['setting'].replace(':', '_')}.json"))
    assert {k: v for k, v in ran.route.settings["families"]["split-attention"].items() if k in ("chunk", "staged", "carried")} \
        == dict(zip(("chunk", "staged", "carried"), (int(judged["setting"].split(":")[0]), "staged" in judged["setting"],
                                                     "carried" in judged["setting"])))
    # The search's baseline is `boltbeam profile --route split.json`, in a process of its own.
    routed = tracefile.load(str(tmp_path / "again" / "baseline.json"))
    assert routed.route.settings["families"]["split-attention"] == {"chunk": 16, "staged": True, "carried": False,
                                                                       "kernel": False, "wide": False, "unrolled": False, "lanes": False,
                                                                       "burst": False, "rotary": False, "pooled": False, "applied": 2, "eligible": 2,
                                                                       "bytes": 0, "build_seconds": 0.0}


def test_profile_with_split_attention(tiny_model, profiled, tiny_default, tmp_path, capsys):
    """At DEPTH the decode reaches past position 16: the later tokens read the cache in two chunks of 16."""
    default = tracefile.load(tiny_default.path)
    split = tracefile.load(profiled(tiny_model, *DEPTH, "--split-attention", "16:staged"))
    fam = split.route.settings["families"]["split-attention"]
    assert split.route.label == "split-attention + tinygrad-scheduler"
    assert fam["chunk"] == 16 and fam["staged"] is True
    assert fam["applied"] == fam["eligible"] == take_census(tiny_model).facts.blocks
    assert split.output_tokens == default.output_tokens
    reads_kv = lambda t: sorted(k.name for k in t.kernels_of_token(0) if k.category == "attention")
    assert reads_kv(split) and reads_kv(split) != reads_kv(default)   # other kernels read the cache now
    # a chunk the family does not list: one line before any loading
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "48"], "one of 16, 32, 64, 128, 256")
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:fused"], "CHUNK[:staged][:carried]")
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:carried:staged"], "CHUNK[:staged][:carried]")
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:staged:kernel"], "the generated kernel takes neither")
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:wide"], "wide, lanes and burst shape the generated kernel alone")
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:wide:kernel"],
            "CHUNK:kernel[:wide[:unrolled]|[:unrolled]:lanes|[:unrolled]:burst][:rotary[:pooled]]")
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:kernel:unrolled"], "unrolled its wide, lanes or burst form")
    # The generated kernel needs thread groups with local memory: this CPU has none (one line, after loading).
    refuses(tiny_model, tmp_path, capsys, ["--split-attention", "16:kernel"], "device CPU has none")
    keys = "keys chunk, staged (and carried, kernel, wide, unrolled, lanes, burst, rotary, pooled, which may be left out)"
    refuses_routes(tiny_model, tmp_path, capsys, {"family": "split_attention"}, "split_attention", (
        ({"chunk": 48, "staged": False}, "one of 16"), ({"chunk": 32}, keys),
        ({"chunk": 32, "staged": True, "carried": False, "fused": True}, keys),
        ("32", "a table (chunk, staged, carried, kernel, wide, unrolled, lanes, burst, rotary, pooled)"),
        ({"chunk": 32, "staged": "yes"}, "staged, carried, kernel, wide, unrolled, lanes, burst, rotary, pooled true or false"),
        ({"chunk": 32, "staged": True, "carried": 1}, "staged, carried, kernel, wide, unrolled, lanes, burst, rotary, pooled true or false")))


def test_search_judges_constants_once_whole(tiny_model, constants_search, tmp_path):
    """search --family constants_once: its one setting judged on the whole token against the route without
    it (here tinygrad's own, the shared default trace); a route that already computes its constants once is
    refused."""
    from boltbeam.measure import route as routes
    from tests.test_search import _run, whole_search_cmd
    out, summary = constants_search
    cmd = whole_search_cmd(tiny_model, "constants_once", tmp_path / "ledger.sqlite")
    (only,) = summary["candidates"]
    assert only["setting"] == "once" and only["verdict"] in VERDICTS and only["predicted_bytes"] == 0
    assert only["predicted_terms"] == ["computed once at load"]
    if summary["chosen"]:
        route = routes.load(str(out / "route.json"))
        assert route.families == {"constants_once": True} and route.provenance == "generated by search"
        done = _run([*cmd, "--on", str(out / "route.json"), "--out", str(tmp_path / "again")])
        assert done.returncode == 2 and "already sets constants_once to the family's only setting" in done.stderr
        assert not (tmp_path / "again").exists()
