"""Split attention's `rotary`: a decode step's query and key norms, rotary step and cache store as one generated
kernel (route/rotary.py), checked against tinygrad's own norms and rotary step, and against the block's own
attention; on the CPU, and with the generated attention kernels on tinygrad's PYTHON device (thread groups)."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from boltbeam.bound.targets import get_target
from boltbeam.errors import BadInput
from boltbeam.read.census import take_census
from boltbeam.route import attention, layout, rotary
from boltbeam.search import choose
from boltbeam.foresight.future import Calibration

EPS = 1e-6


def reference(q, k, v, qw, kw, freqs, cache, p, head_dim, rope_dim):
    """tinygrad.llm's own decode step on the CPU: each head normed (nn.RMSNorm), turned (apply_rope), and the
    key and value stored into a copy of the cache at position p: (query, cache)."""
    from tinygrad import Tensor, nn
    from tinygrad.llm.model import apply_rope
    heads, kv_heads = q.size // head_dim, k.size // head_dim
    cache = cache.copy()

    def turn(x, w, n):
        x = Tensor(x).reshape(1, n, 1, head_dim)
        if w is not None:
            norm = nn.RMSNorm(head_dim, EPS)
            norm.weight = Tensor(w)
            x = norm(x)
        return apply_rope(x[..., :rope_dim], Tensor(freqs)[p:p + 1]).cat(x[..., rope_dim:], dim=-1).numpy()
    cache[0, 0, :, p] = turn(k, kw, kv_heads).reshape(kv_heads, head_dim)
    cache[1, 0, :, p] = v.reshape(kv_heads, head_dim)
    return turn(q, qw, heads).reshape(-1), cache


def inputs(rng, heads, kv_heads, head_dim, rope_dim, positions, normed, stacked):
    """Random projections (q, k, v as (tensor, offset): one stacked product or three), norm weights in half
    precision as tinygrad.llm loads them, a rotary table, a cache; and their numpy arrays."""
    from tinygrad import Tensor, dtypes
    q, k, v = (rng.standard_normal(n * head_dim).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    ws = [rng.uniform(0.5, 1.5, head_dim).astype(np.float16) if normed else None for _ in range(2)]
    angles = np.arange(positions)[:, None] * rng.uniform(0.01, 1.0, rope_dim // 2)[None]
    freqs = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    cache = rng.standard_normal((2, 1, kv_heads, positions, head_dim)).astype(np.float32)
    if stacked:
        whole = Tensor(np.concatenate([q, k, v])).realize()
        parts = ((whole, 0), (whole, q.size), (whole, q.size + k.size))
    else:
        parts = tuple((Tensor(a).realize(), 0) for a in (q, k, v))
    weights = [None if w is None else Tensor(w, dtype=dtypes.half).realize() for w in ws]
    return parts, weights, Tensor(freqs).realize(), Tensor(cache).realize(), (q, k, v, *ws, freqs, cache)


SHAPES = [
    (4, 2, 16, 16, True, True),       # the query and key norms over a head, one stacked product
    (4, 4, 16, 16, True, False),      # three products, a key head for each query head
    (6, 2, 32, 16, False, True),      # no norms; the rotary step over half the head, the rest as it is
    (2, 1, 12, 8, True, False),       # a head not a multiple of the squares' step (no unrolled sum; pooled: 3 x 4)
]


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("heads, kv_heads, head_dim, rope_dim, normed, stacked", SHAPES)
def test_the_rotary_kernel_is_tinygrads_norms_rotary_step_and_store(heads, kv_heads, head_dim, rope_dim, normed, stacked,
                                                                    pooled):
    """Under the JIT with the position a variable, as a decode step runs it: the turned query and the cache
    with this token's key and value stored at the position, the rest of the cache as it was. The pooled form
    (a group a head, the squares summed through local memory) on tinygrad's PYTHON device, which runs groups."""
    from tinygrad import TinyJit, UOp
    rng = np.random.default_rng(head_dim + heads)
    positions = 6
    parts, weights, freqs, cache, arrays = inputs(rng, heads, kv_heads, head_dim, rope_dim, positions, normed, stacked)
    if pooled:
        on = lambda t: t.to("PYTHON").realize()
        parts = tuple((on(t), at) for t, at in parts)
        weights, freqs, cache = [None if w is None else on(w) for w in weights], on(freqs), on(cache)
    pos = UOp.variable("start_pos", 0, positions - 1)

    @TinyJit
    def step(p):
        q, written = rotary.rotary_kernel(*parts, *weights, EPS, freqs, cache, p, heads, head_dim, rope_dim, pooled,
                                          pooled=pooled)
        return q.realize(), written.realize()

    for p in (0, 3, positions - 1):
        want_q, want_cache = reference(*arrays[:-1], arrays[-1], p, head_dim, rope_dim)
        got_q, _ = step(pos.bind(p))
        assert np.abs(got_q.numpy() - want_q).max() <= 1e-5 * np.abs(want_q).max(), p
        got_cache = cache.numpy()
        assert np.abs(got_cache - want_cache).max() <= 1e-5 * np.abs(want_cache).max(), p
        arrays = (*arrays[:-1], got_cache)        # the next step's cache is this one's


def test_the_rotary_kernel_then_the_generated_attention_on_thread_groups():
    """On tinygrad's PYTHON device (thread groups, local memory): the rotary kernel in groups of a head's
    threads, then split attention's lanes kernels reading its query and the cache where they lie, equal to
    tinygrad's norms, rotary step, store and attention."""
    from tinygrad import Tensor, TinyJit, UOp
    rng = np.random.default_rng(7)
    heads, kv_heads, head_dim, positions, chunk = 4, 2, 16, 20, 8
    parts, weights, freqs, cache, arrays = inputs(rng, heads, kv_heads, head_dim, head_dim, positions, True, True)
    on = lambda t: t.to("PYTHON").realize()
    parts = tuple((on(t), at) for t, at in parts)
    weights, freqs, cache = [on(w) for w in weights], on(freqs), on(cache)
    pos = UOp.variable("start_pos", 0, positions - 1)

    @TinyJit
    def step(p):
        q, written = rotary.rotary_kernel(*parts, *weights, EPS, freqs, cache, p, heads, head_dim, head_dim, True)
        return attention.decode_kernels(q.reshape(1, heads, 1, head_dim), written[0, :, :, 0:p + 1, :], chunk,
                                        lanes=True).realize()

    for p in (0, chunk, positions - 1):
        want_q, want_cache = reference(*arrays[:-1], arrays[-1], p, head_dim, head_dim)
        got = step(pos.bind(p)).numpy()
        want = Tensor(want_q).reshape(1, heads, 1, head_dim).scaled_dot_product_attention(
            Tensor(want_cache[0, :, :, :p + 1]), Tensor(want_cache[1, :, :, :p + 1]), enable_gqa=True).numpy()
        assert np.abs(got - want).max() < 1e-5, p
        arrays = (*arrays[:-1], cache.numpy())


def block_and_step(tiny_model, stack: str = "stacked"):
    """The tiny model's first block with the layout's generated kernel, its state made, one token's input."""
    from tinygrad import Tensor
    from tinygrad.llm.model import Transformer
    census = take_census(tiny_model)
    net, _ = Transformer.from_gguf(tiny_model, 32)
    layout.install(net, census, tiny_model, layout.Setting("float32", "kernel", stack))
    b = net.blk[0]
    x = np.random.default_rng(1).standard_normal((1, 1, b.config.dim)).astype(np.float32)
    b._init_state(Tensor(x))
    b.freqs_cis.realize()
    b.cache_kv.assign(Tensor(np.random.default_rng(2).standard_normal(b.cache_kv.shape).astype(np.float32),
                             dtype=b.cache_kv.dtype)).realize()
    return census, net, b, x


def test_rotary_attention_is_the_blocks_own(tiny_model):
    """A decode step's attention with the rotary kernel gives the block's own output and cache; a prefill (more
    than one position) is the block's own graph."""
    from tinygrad import Tensor, UOp
    _, _, b, x = block_and_step(tiny_model)
    start = b.cache_kv.numpy()
    sp = UOp.variable("start_pos", 0, 31).bind(5)
    want, want_cache = b._attention(Tensor(x), sp).numpy(), b.cache_kv.numpy()
    b.cache_kv.assign(Tensor(start, dtype=b.cache_kv.dtype)).realize()
    turned = rotary.RotaryAttention(b, b._attention, thread_groups=False)
    got = turned(Tensor(x), sp).numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(b.cache_kv.numpy() - want_cache).max() <= 1e-5 * np.abs(want_cache).max()
    assert np.abs(want_cache[:, :, :, 5] - start[:, :, :, 5]).max() > 0.1       # the step wrote its key and value
    rows = Tensor(np.repeat(x, 3, axis=1))
    assert turned(rows, 0).uop is b._attention(rows, 0).uop
    length = UOp.variable("toks", 1, 4).bind(2)          # a prefill's length a variable, as the model's JIT has it
    rows = Tensor(np.repeat(x, 4, axis=1))[:, 0:length]
    assert turned(rows, 0).uop is b._attention(rows, 0).uop
    # Inside the block's own step (tinygrad's function, precompiled, the position a parameter of it), twice.
    b.cache_kv.assign(Tensor(start, dtype=b.cache_kv.dtype)).realize()
    want = [b(Tensor(x), UOp.variable("start_pos", 0, 31).bind(p)).numpy() for p in (5, 6)]
    b.cache_kv.assign(Tensor(start, dtype=b.cache_kv.dtype)).realize()
    b._attention = turned
    got = [b(Tensor(x), UOp.variable("start_pos", 0, 31).bind(p)).numpy() for p in (5, 6)]
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()


def test_with_the_generated_attention_the_rotary_kernel_takes_what_futuresight_counts(tiny_model):
    """Scheduled (on the CPU, nothing run) with split attention's generated kernels, a block's decode attention
    has as many kernels fewer as FutureSight removes a block (the stacked product's copy among them), and only
    the rotary kernel and the partials touch the cache: none copies it (as one kernel reading two views would)."""
    from tinygrad import Tensor, UOp
    from boltbeam.route import split_attention
    census, _, b, x = block_and_step(tiny_model)
    sp = UOp.variable("start_pos", 0, 31).bind(9)
    split = attention.Split(32, kernel=True, lanes=True)

    def kernels(attend):
        with attention._split_decode_attention(split, 32, lambda: None):
            out = attend(Tensor(x).realize(), sp)
        return [(getattr(c.src[0].arg, "name", ""), {s.shape for s in c.src[1:]}) for c in out.linear_with_vars()[0].src]
    own, turned = kernels(b._attention), kernels(rotary.RotaryAttention(b, b._attention, True))
    on = lambda stack: {"layout": layout.Setting("float32", "kernel", stack)}     # the settings of the route it goes on
    blocks = census.facts.blocks
    assert split_attention.rotary_kernels_removed(census, on("stacked")) == 4 * blocks
    assert split_attention.rotary_kernels_removed(census, on("separate")) == 3 * blocks
    assert len(own) - len(turned) == 4
    cache = (b.cache_kv.numel(),)
    assert [name for name, shapes in turned if cache in shapes] == ["rotary_4x64", "attention_partials_2x32_lanes2"]
    h200 = get_target("h200")
    with_, without = (split_attention.foresee(census, s, 20, h200, Calibration(), on("stacked"))
                      for s in (dataclasses.replace(split, rotary=True), split))
    assert with_.kernels == without.kernels - 4 * blocks and with_.memory_us == without.memory_us
    assert with_.us(h200) < without.us(h200) and "kernels removed" in with_.terms


def test_the_rotary_setting_and_the_blocks_it_takes(tiny_model, monkeypatch):
    """rotary rides on the generated kernel alone; a route written before it runs it off; install takes every
    block whose attention is tinygrad.llm's own formula, and refuses where none is."""
    from tinygrad import Tensor, UOp
    from boltbeam.route.split_attention import FAMILY
    assert attention.Split.parse("32:kernel:lanes:rotary") == attention.Split(32, kernel=True, lanes=True, rotary=True)
    assert attention.Split.parse("32:kernel:rotary").flag == "32:kernel:rotary"
    assert attention.Split.parse("32:kernel:lanes:rotary:pooled").pooled is True
    with pytest.raises(BadInput, match="rotary runs before the generated kernel alone"):
        attention.Split.parse("32:rotary")
    with pytest.raises(BadInput, match="pooled shapes rotary"):
        attention.Split.parse("32:kernel:pooled")
    with pytest.raises(BadInput, match=r"CHUNK:kernel\[:wide\[:unrolled\]\|\[:unrolled\]:lanes\|\[:unrolled\]:burst\]\[:rotary\[:pooled\]\]"):
        attention.Split.parse("32:kernel:rotary:lanes")
    assert FAMILY.read({"chunk": 32, "staged": False, "kernel": True, "lanes": True}, "route r").rotary is False
    # Among equal predictions (the lanes and unrolled forms of 16 and 32 are, at the floor) the search judges first
    # the setting fewest knobs away from the route's own: rotary added to the route's lanes form of 32.
    route_own = {"chunk": 32, "staged": False, "kernel": True, "lanes": True}
    stored = lambda flag: dataclasses.asdict(attention.Split.parse(flag))
    assert [choose._knobs_changed(stored(f), route_own) for f in
            ("32:kernel:lanes:rotary", "16:kernel:lanes:rotary", "32:kernel:wide:unrolled:rotary",
             "32:kernel:lanes:rotary:pooled")] == [1, 2, 4, 2]
    assert choose._knobs_changed(stored("32:kernel:lanes"), None) == 3 and choose._same_setting(stored("32:kernel:lanes"), route_own)
    census, net, b, x = block_and_step(tiny_model)
    # Every block's decode attention then runs the rotary kernel (scheduled on the CPU, with its thread groups
    # allowed here: the CPU runs none, so nothing is run).
    monkeypatch.setattr(attention, "thread_group_limit", lambda why: 1024)
    done = attention.install(net, census, tiny_model, attention.Split(32, kernel=True, lanes=True, rotary=True))
    assert done.eligible == census.facts.blocks and "rotary: 2 of 2 blocks'" in done.notes[0]
    sp = UOp.variable("start_pos", 0, 31).bind(3)
    names = [getattr(c.src[0].arg, "name", "") for c in b._attention(Tensor(x), sp).linear_with_vars()[0].src]
    assert "rotary_4x64" in names and any(n.startswith("attention_partials") for n in names)
    census, net, b, x = block_and_step(tiny_model)
    done = attention.install(net, census, tiny_model, attention.Split(32, kernel=True, lanes=True, rotary=True, pooled=True))
    assert "local memory" in done.notes[0]
    names = [getattr(c.src[0].arg, "name", "") for c in b._attention(Tensor(x), sp).linear_with_vars()[0].src]
    assert "rotary_4x64_pooled" in names
    monkeypatch.setattr(attention, "thread_group_limit", lambda why: 32)     # a head of 64 threads is too many
    with pytest.raises(BadInput, match="rotary kernel a thread a dimension, 64 a group; device .* allows 32"):
        attention.install(net, census, tiny_model, attention.Split(16, kernel=True, rotary=True, pooled=True))
    monkeypatch.setattr(attention, "thread_group_limit", lambda why: 1024)
    assert rotary.unfit(b) is None
    b.config = dataclasses.replace(b.config, attn_output_gate=True)
    assert rotary.unfit(b) == "its output is gated"
    b.config = dataclasses.replace(b.config, attn_output_gate=False, qk_norm=8)
    assert "span 8 values" in rotary.unfit(b)
    assert "not tinygrad.llm's" in rotary.unfit(SimpleNamespace(config=b.config))
    _, bare, _, _ = block_and_step(tiny_model)
    for blk in bare.blk:
        blk.config = dataclasses.replace(blk.config, rope_dim=3)
    with pytest.raises(BadInput, match="no block's attention takes the rotary kernel .rope over 3 of 64"):
        attention.install(bare, census, tiny_model, attention.Split(32, kernel=True, rotary=True))
