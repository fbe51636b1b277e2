"""The fusion family: an RMS norm folded into the layout's generated kernel for every product that reads
it. Checked against the normed product for every format (byte and word planes, every form), on the
model (the same greedy tokens, the norm's kernels gone), and through the search."""
import dataclasses
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from boltbeam.bound.targets import get_target
from boltbeam.errors import BadInput
from boltbeam.judge.verdicts import VERDICTS
from boltbeam.measure import trace as tracefile
from boltbeam.read.census import take_census
from boltbeam.route import fusion, layout
from boltbeam.search import choose
from boltbeam.route.gemv import Geometry
from boltbeam.foresight.future import Calibration
from tests.processes import DEPTH
from tests.test_families import blocks, reference
from tests.test_profile import refuses, refuses_routes
from tests.test_search import CPU_TARGETS

ROWS, COLS, EPS = 64, 1024, 1e-6
FOLDED = ("attn_norm", "ffn_norm", "output_norm")


def rms_norm(rng, cols: int = COLS):
    from tinygrad import Tensor, nn
    norm = nn.RMSNorm(cols, EPS)
    norm.weight = Tensor(rng.standard_normal(cols).astype(np.float32))
    return norm


@pytest.mark.parametrize("fmt", layout.formats_with_layout())
def test_a_folded_norm_gives_the_normed_product(fmt):
    from tinygrad import Tensor
    rng = np.random.default_rng(3)
    b = blocks(fmt, rng, ROWS, COLS)
    ref = reference(b, fmt, ROWS, COLS)
    module = rms_norm(rng)
    norm = fusion.Norm(module)
    x = (rng.standard_normal(COLS) * 3).astype(np.float32)       # far from unit scale: the norm matters
    normed = x / np.sqrt((x.astype(np.float64) ** 2).mean() + EPS) * module.weight.numpy()
    want = ref @ normed
    for words, geometry in ((False, None), (True, Geometry(8, 4, 2, 16)), (True, Geometry(8, 4, 2, 16, 1))):
        p = layout.repack(b, fmt, ROWS, COLS, "float32")
        if words:                       # the last: the normed input's group sums computed once
            p.to_words()
            p.geometry = geometry
        for form in layout.FORMS:       # the kernel folds it; tensor code runs the norm first
            p.memo = None
            got = p.gemv(Tensor(x).reshape(1, 1, COLS), form, norm).numpy().ravel()
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (fmt, geometry, form)
    # A layer asked once with the norm and once without gets two products, not the first one twice.
    p.memo = None
    xt = Tensor(x).reshape(1, 1, COLS)
    with_norm, without = p.gemv(xt, "kernel", norm).numpy().ravel(), p.gemv(xt, "kernel").numpy().ravel()
    assert np.abs(without - ref @ x).max() <= 1e-5 * np.abs(ref @ x).max() and not np.allclose(with_norm, without)


def test_thread_groups_fold_the_norm_too():
    """On the PYTHON device, which runs thread groups: the squares are reduced over the groups with the
    product, the lanes' partial sums combined for both."""
    from tinygrad import Tensor, dtypes
    rng = np.random.default_rng(8)
    rows, cols = 64, 256
    p = layout.repack(blocks("Q4_K", rng, rows, cols), "Q4_K", rows, cols, "float32")
    p.to_words()
    clear = lambda t: (t.bitcast(dtypes.uint32) & ~(1 << 30)).bitcast(dtypes.float32).contiguous()   # see test_gemv
    p.low = clear(p.low)
    w = p.weights().numpy()
    module = rms_norm(rng, cols)
    x = (rng.standard_normal(cols) * 3).astype(np.float32)
    want = w @ (x / np.sqrt((x.astype(np.float64) ** 2).mean() + EPS) * module.weight.numpy())
    on = dataclasses.replace(p, **{f: t.to("PYTHON").realize() for f in ("low", "scale", "offset")
                                   if (t := getattr(p, f)) is not None}, geometry=Geometry(8, 4, 2, 16), thread_groups=True)
    norm = fusion.Norm(module)
    norm.weight = norm.weight.to("PYTHON").realize()
    got = on.kernel_product(Tensor(x, device="PYTHON").reshape(1, cols), norm).numpy().ravel()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_norm_folds_only_where_every_reader_runs_the_generated_kernel(tiny_model):
    """A block whose value projection stays an ordinary layer keeps its attention norm; its gate and up,
    and the vocabulary projection, take theirs."""
    from tinygrad import Tensor, nn
    census = take_census(tiny_model)
    rng = np.random.default_rng(1)
    kernel = lambda fmt, rows, cols: layout.LayoutLinear(layout.repack(blocks(fmt, rng, rows, cols), fmt, rows, cols),
                                                        None, "kernel")
    f = census.facts
    dim, kv = f.embedding, f.kv_heads * f.head_dim
    b0 = SimpleNamespace(attn_norm=nn.RMSNorm(dim), attn_q=kernel("Q4_K", f.heads * f.head_dim, dim),
                         attn_k=kernel("Q4_K", kv, dim), attn_v=nn.Linear(dim, kv, bias=False),
                         ffn_norm=nn.RMSNorm(dim), ffn_gate=kernel("Q4_K", 64, dim), ffn_up=kernel("Q4_K", 64, dim))
    net = SimpleNamespace(blk=[b0, SimpleNamespace()], output_norm=nn.RMSNorm(dim), output=kernel("Q6_K", 64, dim))
    attn_norm = b0.attn_norm
    done = fusion.install(net, census, tiny_model, fusion.Fusion(norm=1))
    assert (done.applied, done.eligible) == (2, 3) and "1 of 3 norms kept" in done.notes[0]
    assert b0.attn_norm is attn_norm and b0.attn_q.norm is None                  # kept: attn_v reads it too
    assert isinstance(b0.ffn_norm, fusion.Normed) and b0.ffn_gate.norm is b0.ffn_up.norm is not None
    assert isinstance(net.output_norm, fusion.Normed) and net.output.norm is not None
    x = Tensor.ones(1, 1, dim)
    assert b0.ffn_norm(x) is x                                                   # the input goes on un-normed
    bare = SimpleNamespace(blk=[SimpleNamespace(attn_norm=nn.RMSNorm(dim), attn_q=nn.Linear(dim, dim))])
    with pytest.raises(BadInput, match="no norm here has every reader run it"):
        fusion.install(bare, census, tiny_model, fusion.Fusion(norm=1))


def test_profile_with_the_norms_folded(tiny_model, profiled, kernel_form, tmp_path, capsys):
    kernel = tracefile.load(kernel_form.path)        # the same layout, from a route file
    folded = tracefile.load(profiled(tiny_model, *DEPTH, "--layout", "float32:kernel:stacked", "--fusion", "norm"))
    fam = folded.route.settings["families"]["fusion"]
    blocks_ = take_census(tiny_model).facts.blocks
    assert folded.route.label == "generated-layout + fusion + tinygrad-scheduler"
    assert fam["norm"] == 1 and fam["applied"] == fam["eligible"] == 2 * blocks_ + 1
    assert folded.output_tokens == kernel.output_tokens       # (and the kernel form's are the default's: test_families)
    # The folded norms launch nothing of their own; the products that fold them read their weights.
    norms = lambda t: {k.role for k in t.kernels_of_token(0) if k.category == "norm"}
    assert set(FOLDED) <= norms(kernel) and not set(FOLDED) & norms(folded)
    readers = [k for k in folded.kernels_of_token(0) if any(n.endswith(("attn_norm.weight", "ffn_norm.weight",
                                                                         "output_norm.weight")) for n in k.tensors)]
    assert readers and all(k.category == "weights" and k.name.endswith("_normed") for k in readers)
    assert len(folded.kernels_of_token(0)) < len(kernel.kernels_of_token(0))
    for flags, said in ((["--fusion", "norm"], "needs --layout SCALES:kernel"),
                        (["--layout", "float32:factored", "--fusion", "norm"], "needs --layout SCALES:kernel"),
                        (["--layout", "float32:kernel", "--fusion", "residual"], "expected what to fold")):
        refuses(tiny_model, tmp_path, capsys, flags, said)
    refuses_routes(tiny_model, tmp_path, capsys, {"family": "fusion", "layout": {
        "scale_dtype": "float32", "form": "kernel", "stack": "stacked"}}, "fusion", (
        ("norm", "fusion must be a table"), ({"norms": 1}, "expected the keys norm, gated, rms"),
        ({"norm": 1}, "expected the keys norm, gated, rms"),
        ({"norm": 2, "gated": 0, "rms": 0}, "norm must be one of 0, 1"),
        ({"norm": 0, "gated": 1, "rms": 0, "inplace": 2}, "inplace must be one of 0, 1"),
        ({"norm": 0, "gated": 0, "rms": 0}, "folds nothing")))
    # The generated norm runs a thread group with local memory: this CPU has none (one line).
    refuses(tiny_model, tmp_path, capsys, ["--layout", "float32:kernel", "--fusion", "rms"], "device CPU has none")


def test_futuresight_on_folded_norms(tiny_model):
    from boltbeam.route.attention import Split
    census = take_census(tiny_model)
    h200 = get_target("h200")
    settings, rejected = choose.space(fusion.FAMILY, h200)     # every knob off is the route itself: no candidate
    three = {"norm", "gated", "rms", "norm+gated", "norm+rms", "gated+rms", "norm+gated+rms"}
    assert {s.flag for s in settings} == three | {f"{s}+inplace" for s in three} | {"inplace"} and not rejected
    # The generated norm runs a thread group: a target that declares none gets the rest.
    host = get_target("host-like", [CPU_TARGETS])
    settings, rejected = choose.space(fusion.FAMILY, host)
    assert {s.flag for s in settings} == {"norm", "gated", "norm+gated", "inplace", "norm+inplace", "gated+inplace",
                                          "norm+gated+inplace"}
    assert rejected == {"the target declares no max_threads_per_group": 8}
    folded = fusion.Fusion(norm=1)
    on = {"layout": layout.Setting("float16", "kernel", "separate")}      # the settings of the route it goes on
    stacked_on = {"layout": layout.Setting("float16", "kernel", "stacked")}
    separate = fusion.foresee(census, folded, 0, h200, Calibration(), on)
    stacked = fusion.foresee(census, folded, 0, h200, Calibration(), stacked_on)
    # Each product that folds a norm reads its weight (float32): one product a stack, one a layer unstacked.
    f = census.facts
    readers_a_block = 5           # query, key, value; gate, up
    assert separate.bytes == (f.blocks * readers_a_block + 1) * f.embedding * 4 and separate.kernels == 0
    assert stacked.bytes < separate.bytes
    # A fused feed-forward reads nothing of its own: with the norms, their bytes; alone, first in the order.
    gated = [fusion.foresee(census, s, 0, h200, Calibration(), on) for s in
             (fusion.Fusion(gated=1), fusion.Fusion(norm=1, gated=1))]
    assert (gated[0].bytes, gated[0].kernels, gated[1].bytes) == (0, -f.blocks, separate.bytes)
    assert gated[1].kernels == gated[0].kernels and "kernels removed" in gated[0].terms
    # the stack's copy goes too
    assert fusion.foresee(census, fusion.Fusion(gated=1), 0, h200, Calibration(), stacked_on).kernels == \
        -2 * f.blocks
    # A generated norm adds kernels for each norm not folded (its buffers' elementwise work runs apart):
    # every one of them, or none left; the fused feed-forward's still go.
    norms = 2 * f.blocks + 1
    rms = [fusion.foresee(census, s, 0, h200, Calibration(), on) for s in
           (fusion.Fusion(rms=1), fusion.Fusion(norm=1, rms=1), fusion.Fusion(gated=1, rms=1))]
    added = fusion.RMS_KERNELS_ADDED * norms
    assert [p.kernels for p in rms] == [added, 0, added - f.blocks] and "kernels added" in rms[0].terms
    # So the fused feed-forward alone orders before the generated norm.
    assert gated[0].us(h200) < rms[0].us(h200)
    assert "layout form is kernel" in fusion.FAMILY.refuses({"layout": layout.Setting("float16", "expanded")})
    assert fusion.FAMILY.refuses(on) is None and "layout form is kernel" in fusion.FAMILY.refuses({})
    # Read in place, the attention's output loses its copy where split attention runs its generated kernels
    # (one a block, each output projection the layout takes); on tensor-code attention there is no copy to lose.
    inplace = fusion.Fusion(gated=1, inplace=1)
    kernel_attention = {**on, "split_attention": Split(32, kernel=True)}
    assert fusion.foresee(census, inplace, 0, h200, Calibration(), kernel_attention).kernels == \
        gated[0].kernels - f.blocks
    assert fusion.foresee(census, inplace, 0, h200, Calibration(), on).kernels == gated[0].kernels


@pytest.mark.parametrize("view, in_place", [("reshaped", True), ("permuted", True), ("shrunk", False)])
def test_a_product_reads_a_generated_kernels_output_in_place(view, in_place):
    """A generated kernel's output seen through reshapes and a permute of axes of one (as a model's attention
    output is) is read by the product where it lies: the same product, one kernel fewer (tinygrad copies it
    otherwise). A view that is not the same elements in order (a shrink) is copied as before."""
    from tinygrad import Tensor, UOp
    from tinygrad.uop.ops import KernelInfo
    from boltbeam.search.alone import Shape, random_planes
    rng = np.random.default_rng(5)
    heads, dim = 4, 64
    p = random_planes(Shape(ROWS, heads * dim, 4, 32, True), "float16", rng)
    rows = heads + (view == "shrunk")
    a = Tensor(rng.standard_normal((rows, dim)).astype(np.float32)).realize()

    def double(Y, X):                 # another generated kernel: the product's input is its output
        Y, X = Y.flatten(), X.flatten()
        i = UOp.range(rows * dim, 0)
        return Y[i].store(X[i] * 2).end(i).sink(arg=KernelInfo(name="twice", opts_to_apply=()))

    def product(reads_in_place: bool):
        p.reads_in_place, p.memo = reads_in_place, None
        y = Tensor.custom_kernel(Tensor.empty(rows, dim), a, fxn=double)[0]
        x = {"reshaped": lambda: y.reshape(1, 1, heads * dim),
             "permuted": lambda: y.reshape(1, heads, 1, dim).transpose(1, 2).reshape(1, 1, -1),
             "shrunk": lambda: y[1:].reshape(1, 1, -1)}[view]()
        return p.gemv(x, "kernel")

    # (each value from a graph of its own, and each count from another: scheduling a graph rewrites its tensors)
    kernels = lambda reads_in_place: len(product(reads_in_place).linear_with_vars()[0].src)
    want = (2 * a.numpy()[rows - heads:].reshape(-1)) @ p.weights().numpy().T
    for reads_in_place in (False, True):
        np.testing.assert_allclose(product(reads_in_place).numpy().ravel(), want, rtol=1e-4, atol=1e-3)
    assert kernels(True) == kernels(False) - in_place


def test_search_judges_folded_norms_on_a_kernel_form_route(tiny_model, kernel_form, tmp_path):
    """Judged against the route alone: the shared profile of it (the search checks it is that route's)."""
    from boltbeam.measure import route as routes
    from tests.test_search import CPU_TARGETS, _ok, _run
    on = routes.load(str(kernel_form.route))
    out = tmp_path / "fusion"
    cmd = [sys.executable, "-m", "boltbeam", "search", tiny_model, "--device", "CPU", "--target", "host-like",
           "--targets", CPU_TARGETS, "--family", "fusion", *DEPTH,
           "--ledger", str(tmp_path / "ledger.sqlite"), "--budget", "1", "--json"]
    summary = json.loads(_ok(_run([*cmd, "--on", str(kernel_form.route), "--baseline", str(kernel_form.path),
                                   "--out", str(out)])).stdout)
    # FutureSight's first of the seven is judged, no other: one that reads nothing more (the fused feed-forward,
    # or inplace, which finds no generated kernel feeding a product here: the same prediction), none with a norm.
    first, *rest = summary["candidates"]
    assert len(rest) == 6 and all("budget" in c["skipped"] for c in rest)
    assert first["predicted_bytes"] == 0 and first["predicted_us"] == min(c["predicted_us"] for c in rest + [first])
    assert "norm" not in first["setting"] and first["verdict"] in VERDICTS and first["median_us"] > 0
    ran = tracefile.load(str(out / f"fusion_{first['setting']}.json"))
    assert ran.route.label == "generated-layout + fusion + boltbeam-search"
    if summary["chosen"]:
        route = routes.load(str(out / "route.json"))
        assert route.families["layout"] == on.families["layout"]
        assert route.families["fusion"] == dataclasses.asdict(fusion.Fusion.parse(first["setting"]))
        assert route.provenance == "generated by search"
    done = _run([*cmd, "--out", str(tmp_path / "none")])          # no route: nothing to fold into
    assert done.returncode == 2 and "layout form is kernel" in done.stderr and not (tmp_path / "none").exists()


@pytest.mark.parametrize("cols", [64, 576, 4096])     # groups of 16, 64 and 256 threads
def test_a_generated_norm_is_the_rms_norm(cols):
    """The generated norm (one thread group, squares summed through local memory) on tinygrad's PYTHON
    device, which runs thread groups, local memory and barriers, against tinygrad's RMSNorm."""
    from tinygrad import Tensor
    rng = np.random.default_rng(cols)
    module = rms_norm(rng, cols)
    x = (rng.standard_normal((1, 1, cols)) * 3).astype(np.float32)
    want = module(Tensor(x)).numpy()
    got = fusion.norm_kernel(Tensor(x, device="PYTHON"), module.weight.to("PYTHON"), EPS).numpy()
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    # A prefill's rows (more than one) take the module itself.
    rows = Tensor(np.repeat(x, 3, axis=1))
    assert fusion.GeneratedNorm(module)(rows).uop is module(rows).uop
    assert [fusion.group_threads(c) for c in (cols, 7, 8)] == [{64: 16, 576: 64, 4096: 256}[cols], None, 4]


def test_a_gated_feed_forward_is_the_blocks_own_in_fewer_kernels(tiny_model, profiled, kernel_form):
    """gated: each block's feed-forward, its gate and up rows read from the stacked product uncopied, gives
    what tinygrad.llm's own gives (with its copy and its activation made contiguous), in two kernels fewer."""
    from tinygrad import Tensor
    from tinygrad.llm.model import Transformer
    census = take_census(tiny_model)
    net, _ = Transformer.from_gguf(tiny_model, 8)
    layout.install(net, census, tiny_model, layout.Setting("float32", "kernel", "stacked"))
    x = np.random.default_rng(5).standard_normal((1, 1, census.facts.embedding)).astype(np.float32)
    # Each call a new input, so no product is memoized; kernels counted on one call, values read from another
    # (a tensor whose schedule was listed reads back zeros in tinygrad 0.13.0).
    kernels = lambda ff: len(ff(Tensor(x).realize()).linear_with_vars()[0].src)
    value = lambda ff: ff(Tensor(x).realize()).numpy()
    own = [(kernels(b._feed_forward), value(b._feed_forward)) for b in net.blk]
    done = fusion.install(net, census, tiny_model, fusion.Fusion(gated=1))
    assert (done.applied, done.eligible) == (census.facts.blocks,) * 2
    for b, (n, want) in zip(net.blk, own):
        assert isinstance(b._feed_forward, fusion.GatedFeedForward)
        assert kernels(b._feed_forward) == n - 2 and np.abs(want).max() > 0
        assert np.abs(value(b._feed_forward) - want).max() <= 1e-6 * np.abs(want).max()
    # A prefill of variable length (tensor code) takes the block's own feed-forward, the same graph.
    from tinygrad import UOp
    length = UOp.variable("T", 1, 4).bind(2)
    xs = Tensor(np.repeat(x, 4, axis=1))[:, 0:length]
    ff = net.blk[0]._feed_forward
    assert ff(xs).uop is ff.original(xs).uop and ff(Tensor(x)).uop is not ff.original(Tensor(x)).uop
    # A block whose gate and up are not the layout's generated kernel keeps its own; none such: one line.
    bare, _ = Transformer.from_gguf(tiny_model, 8)
    with pytest.raises(BadInput, match="no block has one"):
        fusion.install(bare, census, tiny_model, fusion.Fusion(gated=1))
    # Blocks whose feed-forward is another formula (an adapter's, e.g. GELU): the line says that, not --layout.
    for b in bare.blk:
        b.__class__ = type("OtherFormula", (type(b),), {"_feed_forward": lambda self, x: x})
    with pytest.raises(BadInput, match="SiLU-gated formula"):
        fusion.install(bare, census, tiny_model, fusion.Fusion(gated=1))
    folded = tracefile.load(profiled(tiny_model, *DEPTH, "--layout", "float32:kernel:stacked", "--fusion", "gated"))
    plain = tracefile.load(kernel_form.path)
    assert folded.output_tokens == plain.output_tokens
    assert len(folded.kernels_of_token(0)) == len(plain.kernels_of_token(0)) - 2 * census.facts.blocks


def test_a_route_from_before_inplace_runs_it_off():
    """A route file's fusion table written before the inplace knob existed reads as that knob off; one that
    leaves out a knob the first routes had is refused."""
    read = fusion.FAMILY.read
    assert read({"norm": 0, "gated": 1, "rms": 0}, "route r: fusion") == fusion.Fusion(gated=1)
    assert read({"norm": 0, "gated": 1, "rms": 0, "inplace": 1}, "route r: fusion") == fusion.Fusion(gated=1, inplace=1)
    with pytest.raises(BadInput, match="expected the keys norm, gated, rms .and inplace, which may be left out"):
        read({"gated": 1, "inplace": 1}, "route r: fusion")
