"""Half cache: each block's KV cache held in float16 where tinygrad.llm holds float32, on one tinygrad.llm block of
tiny random weights (its prefill and a decode step, against a twin block of the same weights on tinygrad's own
float32 cache), and what FutureSight prices for it."""
import types

import numpy as np
import pytest

from boltbeam.errors import BadInput
from boltbeam.route import half_cache

HEADS, KV_HEADS, HEAD_DIM, CONTEXT, PROMPT = 4, 2, 16, 24, 5


def block():
    from tinygrad import Tensor
    from tinygrad.llm.model import TransformerBlock, TransformerConfig
    from tinygrad.nn.state import get_state_dict
    config = TransformerConfig(num_blocks=1, dim=HEADS * HEAD_DIM, hidden_dim=8, n_heads=HEADS, n_kv_heads=KV_HEADS,
                               norm_eps=1e-6, vocab_size=8, head_dim=HEAD_DIM, rope_theta=10000.0, rope_dim=HEAD_DIM,
                               v_head_dim=HEAD_DIM, max_context=CONTEXT, qk_norm=HEAD_DIM)
    b = TransformerBlock(config)
    rng = np.random.default_rng(0)
    for t in get_state_dict(b).values():
        t.replace(Tensor((rng.standard_normal(t.shape) / 4).astype(np.float32)).realize())
    return b


def prefill_then_decode(b) -> tuple[np.ndarray, np.ndarray]:
    """The block's attention over a prompt of PROMPT positions, then a decode step at the next (the cache written
    by both)."""
    from tinygrad import Tensor, UOp
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((1, PROMPT, HEADS * HEAD_DIM)).astype(np.float32))
    b._init_state(x)
    prefill = b._attention(x, 0).numpy()
    step = Tensor(rng.standard_normal((1, 1, HEADS * HEAD_DIM)).astype(np.float32))
    b._init_state(step)
    return prefill, b._attention(step, UOp.variable("start_pos", 0, CONTEXT - 1).bind(PROMPT)).numpy()


def test_each_blocks_cache_is_float16_and_its_attention_tinygrads_within_half_rounding():
    from tinygrad import dtypes
    own, halved = block(), block()
    done = half_cache.install(types.SimpleNamespace(blk=[halved]), None, "m.gguf", half_cache.Half())
    want, got = prefill_then_decode(own), prefill_then_decode(halved)
    assert own.cache_kv.dtype == dtypes.float32 and halved.cache_kv.dtype == dtypes.float16
    assert (done.applied, done.eligible, done.bytes) == (1, 1, 2 * KV_HEADS * CONTEXT * HEAD_DIM * 2)   # made once
    for w, g in zip(want, got):
        error = np.abs(w - g).max()
        assert 0 < error <= 1e-2 * np.abs(w).max()     # rounded to float16 in the cache, and no further
    with pytest.raises(BadInput, match="no block makes a KV cache"):
        half_cache.install(types.SimpleNamespace(blk=[]), None, "m.gguf", half_cache.Half())


def test_what_the_attention_stores_into_the_cache_is_float16():
    """tinygrad.llm's store casts nothing: a float32 value stored into the float16 cache compiles on the CPU (C
    converts it) and not on CUDA (no float16 header), so the store itself must carry the cast."""
    from tinygrad import Tensor, dtypes
    from tinygrad.uop.ops import Ops, UOp
    b = block()
    half_cache.install(types.SimpleNamespace(blk=[b]), None, "m.gguf", half_cache.Half())
    x = Tensor(np.ones((1, PROMPT, HEADS * HEAD_DIM), dtype=np.float32))
    b._init_state(x)
    stores = [u for u in b._attention(x, 0).uop.toposort() if u.op is Ops.STORE]
    assert stores and all(s.src[0].dtype == s.src[1].dtype == dtypes.half for s in stores)
    assert UOp.store.__name__ == "store" and UOp.store.__qualname__ == "UOp.store"     # tinygrad's own again after


def test_futuresight_prices_the_cache_at_two_bytes(tiny_model):
    from boltbeam.bound.targets import get_target
    from boltbeam.read.census import take_census
    from boltbeam.route import split_attention
    from boltbeam.route.attention import Split
    from boltbeam.foresight.future import Calibration
    census, h200, cal = take_census(tiny_model), get_target("h200"), Calibration()
    f, half, context = census.facts, half_cache.Half(), 40
    alone = half_cache.foresee(census, half, context, h200, cal, {})
    assert alone.bytes == f.blocks * (context + 1) * f.kv_heads * (f.head_dim + f.value_dim) * 2
    split = Split(16, kernel=True, lanes=True)
    on_float = split_attention.foresee(census, split, context, h200, cal, {"split_attention": split})
    on_half = half_cache.foresee(census, half, context, h200, cal, {"split_attention": split})
    assert on_half.bytes * 2 == on_float.bytes and on_half.memory_us <= on_float.memory_us
