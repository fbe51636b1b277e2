"""Every form split attention takes, against tinygrad's own attention: each setting of spaces.toml's
split_attention switches that Split admits (the tensor code plain, staged, carried; the generated kernels
narrow, wide, wide unrolled, lanes, lanes unrolled, burst, burst unrolled; each generated form with the rotary
kernel before it, plain or pooled), run through the selector the model's hook calls, on one tinygrad.llm TransformerBlock of tiny random
weights whose output projection is the identity (its attention's output is the attention's own), at a depth of
whole chunks and one that ends inside a chunk, against the same block's decode step through tinygrad's own
norms, rotary step, cache store and scaled_dot_product_attention. On tinygrad's PYTHON device, which runs thread
groups, local memory and barriers."""
import itertools

import numpy as np
import pytest

from boltbeam.route import attention, rotary

DEV = "PYTHON"
HEADS, KV_HEADS, HEAD_DIM, CONTEXT = 4, 2, 32, 40
CHUNK = 16                   # a cache of 40 positions: three chunks, the last past its end
DEPTHS = (16, 37)            # positions so far: whole chunks, and one ending inside the third
TOTAL = -(-CONTEXT // CHUNK) * CHUNK


def settings() -> list[attention.Split]:
    """Every setting of the family's switches that Split admits, at chunks of CHUNK."""
    from boltbeam.foresight.space import families
    space = families()[attention.SPACE].parameters
    assert set(space) == {"chunk", *attention.KNOBS}, "a switch spaces.toml lists that Split does not know"
    combos = (dict(zip(attention.KNOBS, values)) for values in itertools.product(*(space[k] for k in attention.KNOBS)))
    return [attention.Split(CHUNK, **{k: bool(v) for k, v in c.items()}) for c in combos if attention.Split.admits(c)]


SETTINGS = settings()


def generated(split: attention.Split) -> set[str]:
    """The names of the generated kernels the setting runs (the tensor code: none)."""
    if not split.kernel:
        return set()
    group = HEADS // KV_HEADS
    burst = f"_burst{attention.burst_runs(group, HEAD_DIM, CHUNK)}"     # (runs of keys a thread loads)
    form = (f"_lanes{HEAD_DIM // CHUNK}" if split.lanes else burst if split.burst else "_wide" if split.wide else "") + (
        "_unrolled" if split.unrolled else "")
    names = {f"attention_partials_{group}x{CHUNK}{form}"}
    if split.rotary:
        names.add(f"rotary_{HEADS}x{HEAD_DIM}" + ("_pooled" if split.pooled else ""))
    return names


@pytest.fixture(scope="module")
def block():
    """The block, a decode step's input, the cache's starting contents, and tinygrad's own output at each depth."""
    from tinygrad import Tensor, UOp
    from tinygrad.llm.model import TransformerBlock, TransformerConfig
    from tinygrad.nn.state import get_state_dict
    dim = HEADS * HEAD_DIM
    config = TransformerConfig(num_blocks=1, dim=dim, hidden_dim=8, n_heads=HEADS, n_kv_heads=KV_HEADS, norm_eps=1e-6,
                               vocab_size=8, head_dim=HEAD_DIM, rope_theta=10000.0, rope_dim=HEAD_DIM,
                               v_head_dim=HEAD_DIM, max_context=CONTEXT, qk_norm=HEAD_DIM)
    b = TransformerBlock(config)
    rng = np.random.default_rng(3)
    for name, t in get_state_dict(b).items():
        value = (np.eye(dim) if name == "attn_output.weight" else rng.uniform(0.5, 1.5, t.shape) if "norm" in name
                 else rng.standard_normal(t.shape) / np.sqrt(t.shape[-1]))
        t.replace(Tensor(value.astype(np.float32), device=DEV).realize())
    x = Tensor(rng.standard_normal((1, 1, dim)).astype(np.float32), device=DEV).realize()
    b._init_state(x)
    b.freqs_cis.realize()
    start = rng.standard_normal(b.cache_kv.shape).astype(np.float32)
    own = {}
    for depth in DEPTHS:
        b.cache_kv.assign(Tensor(start, device=DEV)).realize()
        own[depth] = b._attention(x, UOp.variable("start_pos", 0, CONTEXT - 1).bind(depth - 1)).numpy()
    return b, x, start, own


def test_every_admitted_setting_is_here():
    """The tensor code's four settings, seven generated forms, each alone and with rotary, plain or pooled."""
    assert len(SETTINGS) == 4 + 7 * 3 and len({s.flag for s in SETTINGS}) == len(SETTINGS)
    assert all(s.unfit(HEAD_DIM) is None for s in SETTINGS)


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("split", SETTINGS, ids=lambda s: s.flag)
def test_each_form_is_tinygrads_attention(block, split, depth):
    """Through the hook the model's blocks run (the selector decode_attention) or, with rotary, the block's
    attention as RotaryAttention runs it: the hook took the step, the setting's own generated kernels ran, and
    the output is tinygrad's own within float32 rounding."""
    from tinygrad import Tensor, UOp
    b, x, start, own = block
    step = rotary.RotaryAttention(b, b._attention, True, split.pooled) if split.rotary else b._attention
    taken = []

    def decode():          # the step's graph (tinygrad runs none of a graph once asked for its schedule: made twice)
        with attention._split_decode_attention(split, TOTAL, lambda: taken.append(1)):
            return step(x, UOp.variable("start_pos", 0, CONTEXT - 1).bind(depth - 1))
    names = {getattr(call.src[0].arg, "name", "") for call in decode().linear_with_vars()[0].src}
    assert {n for n in names if n.startswith(("attention_", "rotary_")) and "combine" not in n} == generated(split)
    b.cache_kv.assign(Tensor(start, device=DEV)).realize()
    got = decode().numpy()
    assert taken == [1, 1]
    assert np.abs(got - own[depth]).max() <= 1e-5 * np.abs(own[depth]).max(), split.flag


def test_the_selector_leaves_the_rest_to_tinygrad():
    """A prefill (more than one query position), and a batch of two with the generated kernels, are not the
    decode step the forms compute: the selector gives None and the hook calls tinygrad's own."""
    from tinygrad import Tensor
    q3 = Tensor.empty(1, HEADS, 3, HEAD_DIM)
    kv = Tensor.empty(1, KV_HEADS, 8, HEAD_DIM)
    kernel, tensor_code = attention.Split(CHUNK, kernel=True), attention.Split(CHUNK)
    assert attention.decode_attention(kernel, q3, kv, kv, TOTAL) is None
    assert attention.decode_attention(tensor_code, q3, kv, kv, TOTAL) is None
    q2, kv2 = Tensor.empty(2, HEADS, 1, HEAD_DIM), Tensor.empty(2, KV_HEADS, 8, HEAD_DIM)
    assert attention.decode_attention(kernel, q2, kv2, kv2, TOTAL) is None
    assert attention.decode_attention(tensor_code, q2, kv2, kv2, TOTAL) is not None
    assert attention.decode_attention(tensor_code, Tensor.empty(1, 3, 1, HEAD_DIM), kv, kv, TOTAL) is None


@pytest.mark.parametrize("unrolled", [False, True])
def test_the_lanes_combine_over_more_chunks_than_a_step_takes(unrolled):
    """lanes, with its combine's loops over the chunks plain or COMBINE_STEP chunks a step written out: 33 chunks
    of 8 positions, more than its 32 threads take at once for their maxima and several steps for its sums, at every
    chunk and at a depth ending inside one, against tinygrad's own attention (the cache written in the same graph)."""
    from tinygrad import Tensor, UOp
    rng = np.random.default_rng(5)
    kv_heads, group, head_dim, positions, chunk = 1, 2, 8, 264, 8
    cache = Tensor(rng.standard_normal((2, 1, kv_heads, positions, head_dim)).astype(np.float32), device=DEV).realize()
    for depth in (100, positions):
        q = Tensor(rng.standard_normal((1, kv_heads * group, 1, head_dim)).astype(np.float32), device=DEV).realize()
        x = Tensor(rng.standard_normal((2, 1, kv_heads, 1, head_dim)).astype(np.float32), device=DEV).realize()
        p = UOp.variable("start_pos", 0, positions - 1).bind(depth - 1)
        written = Tensor(cache.uop.after(cache[:, :, :, p:p + 1, :].uop.store(x.uop)))
        out = attention.decode_kernels(q, written[0, :, :, 0:p + 1, :], chunk, unrolled=unrolled, lanes=True)
        names = {getattr(call.src[0].arg, "name", "") for call in out.linear_with_vars()[0].src}
        assert ("attention_combine_33_lanes4_unrolled8" in names) == unrolled
        written = Tensor(cache.uop.after(cache[:, :, :, p:p + 1, :].uop.store(x.uop)))
        got = attention.decode_kernels(q, written[0, :, :, 0:p + 1, :], chunk, unrolled=unrolled, lanes=True).numpy()
        kv = cache.numpy()
        want = q.to("CPU").scaled_dot_product_attention(Tensor(kv[0, :, :, :depth]), Tensor(kv[1, :, :, :depth]),
                                                        enable_gqa=True).numpy()
        assert np.abs(got - want).max() < 1e-5, depth
