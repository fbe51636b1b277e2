"""Half cache: the KV cache held in float16, where tinygrad.llm holds it in float32.

tinygrad.llm's block makes its cache on its first call with `Tensor.empty` and no type, so of the default float
type, float32: twice the bytes of the float16 element the bound counts (and llama.cpp holds). At depth a decode
token reads the whole cache so far (on the H200 at depth 4096, 1.21 GB of the route's 4.5 ms token,
bench/h200/s16/). This family has each block's cache made in float16 right after the block's own state
initialisation, before anything writes it, and each block's attention cast what it stores into the cache to the
cache's type: tinygrad.llm stores its keys and values with `UOp.store`, which casts nothing (on the CPU the C
compiler converts a float written into a float16 buffer; on CUDA the renderer adds no float16 header for a kernel
whose only float16 is that buffer, and the prefill's kernel does not compile). The rotary kernel casts its own
stores; every reader casts the cache back up. A switch: on or off.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

from boltbeam.errors import BadInput
from boltbeam.measure.prepared import Prepared
from boltbeam.route.family import Family, Replaces, Switch, after_init_state, switch
from boltbeam.foresight.future import Foreseen

LABEL = "half-cache"           # what it adds to a trace's route label
SPACE = "half_cache"           # its one knob: data/spaces.toml
VALUE_BYTES = 2                # a cached key or value element in float16


@dataclass(frozen=True)
class Half(Switch):
    """The family's setting, as the search judges it (profile --half-cache; the route's half_cache)."""
    SPACE: ClassVar[str] = SPACE
    CACHE_ELEMENT_BYTES: ClassVar[int] = VALUE_BYTES     # the cache's element as this setting holds it
    half: int = 1


def install(net, census=None, model_path: str | None = None, setting: Half | None = None) -> Prepared:
    """Wrap each block's state initialisation so the cache it makes is remade in float16 before any use, and its
    attention so what it stores there is cast to float16."""
    from tinygrad import Tensor, dtypes
    prepared = Prepared(LABEL, {})

    def halve(block):
        cache = getattr(block, "cache_kv", None)
        if cache is not None and cache.dtype != dtypes.half:       # (its first call: nothing has written it)
            block.cache_kv = Tensor.empty(*cache.shape, dtype=dtypes.half, device=cache.device)
            prepared.applied += 1
            prepared.bytes += block.cache_kv.nbytes()
    prepared.eligible = after_init_state(net, halve)
    if not prepared.eligible:
        raise BadInput(f"model {model_path}: no block makes a KV cache of its own: nothing to hold in float16")
    for block in net.blk:
        if (attention := getattr(block, "_attention", None)) is not None:
            block._attention = _stores_cast(attention)
    return prepared


def _stores_cast(attention):
    """The attention with every value it stores cast to the type of what it is stored into."""
    def cast_attention(*args, **kwargs):
        with _casting_stores():
            return attention(*args, **kwargs)
    return cast_attention


@contextlib.contextmanager
def _casting_stores():
    """UOp.store, while it lasts, casts its value to the type of the view it stores into where the two differ
    (a pointer's stores, inside a generated kernel, are left alone)."""
    from tinygrad.dtype import PtrDType
    from tinygrad.uop.ops import UOp
    original = UOp.store

    def store(self, src, *args, **kwargs):
        if isinstance(src, UOp) and not isinstance(self.dtype, PtrDType) and src.dtype.scalar() != self.dtype.scalar():
            src = src.cast(self.dtype.scalar().vec(src.dtype.count))
        return original(self, src, *args, **kwargs)
    UOp.store = store
    try:
        yield
    finally:
        UOp.store = original


def foresee(census, half: Half, context: int, target, cal, on=None) -> Foreseen:
    """The cache a decode token reads, at two bytes an element: priced by split attention's own term where the
    route splits it (its kernels on the float16 cache), else as the cache's bytes at the bandwidth."""
    from boltbeam.route import split_attention
    settings = dict(on or {})
    if split_attention.FAMILY.key in settings:
        settings[FAMILY.key] = half
        return split_attention.foresee(census, settings[split_attention.FAMILY.key], context, target, cal, settings)
    nbytes = split_attention.cache_bytes(census.facts, context + 1, VALUE_BYTES)
    return Foreseen(nbytes, 0, nbytes / target.bandwidth * 1e6, ("the float16 cache at the bandwidth",))


FAMILY = Family(SPACE, LABEL, "half_cache", install=install, read=switch(Half), of_values=lambda v: Half(**v),
                foresee=foresee, replaces=Replaces(regions=("attention",)),
                help="hold each block's KV cache in float16 (tinygrad.llm holds it in float32): half the bytes "
                     "a decode token's attention reads at depth")
