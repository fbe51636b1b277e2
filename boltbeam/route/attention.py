"""Decode attention split over the sequence, then a combine: the KV cache read by many groups at once.

At decode a query of one position attends over every cached position so far, a length tinygrad
holds as a variable. tinygrad cannot split a reduction whose length is a variable, so each head's
sum over the sequence runs in one group, however long the sequence is. This family writes the same
attention as tensor code whose long reduction has a fixed length: the cached keys and values, padded
to the cache's whole length, are cut into chunks of `chunk` positions; only the chunks that hold a
position so far are read (their count is the variable now, an axis of the output, not of a
reduction); each chunk gives its own maximum, sum of exponentials and weighted values, and a combine
over the chunks rescales them to one softmax, as a split-K flash-decoding kernel does.

`staged` is the family's second knob. Unstaged, tinygrad may fuse each chunk's weighted values and
sum into the combine, whose reduction then runs over every position in few groups again (on the
H200 one such kernel took 34 µs of a layer's ~48). Staged, the chunks' maxima, sums and weighted
values are written to buffers of their own first, so the weighted values keep the chunk as an
output axis, and the combine reduces over the chunks alone: two kernels more a layer.

`carried`, the third, sums each chunk's exponentials as one more column of its weighted values (a
column of ones beside the values), and the combine's denominator as one more column of its output:
two reductions fewer a layer (each chunk's sum, the combine's denominator), one division more.

It takes every attention a block computes through `Tensor.scaled_dot_product_attention` with one
query position and no mask (the decode step; the prefill keeps tinygrad's own), found by that fact,
not by the block's class or the model.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import asdict, dataclass

from boltbeam.errors import BadInput
from boltbeam.measure.route import SPLIT_ATTENTION_LABEL
from boltbeam.measure.tinygrad_run import Prepared

FAMILY = SPLIT_ATTENTION_LABEL
SPACE = "split_attention"           # its knob's values: data/spaces.toml


@dataclass(frozen=True)
class Split:
    """One setting of the family: positions a chunk, whether the chunks' partials are staged, and whether
    the sums of exponentials ride as a column of the weighted values."""
    chunk: int
    staged: bool = False
    carried: bool = False

    def __post_init__(self):
        from boltbeam.search.space import families
        space = families()[SPACE].parameters
        if not (isinstance(self.chunk, int) and self.chunk in space["chunk"]
                and all(isinstance(getattr(self, k), bool) and int(getattr(self, k)) in space[k] for k in KNOBS)):
            raise BadInput(f"split attention {self.chunk!r}, staged {self.staged!r}, carried {self.carried!r}: positions "
                           f"per chunk must be one of {', '.join(map(str, space['chunk']))}, staged and carried true or "
                           f"false (spaces.toml, family {SPACE})")

    @property
    def flag(self) -> str:
        return ":".join([str(self.chunk), *(k for k in KNOBS if getattr(self, k))])

    @classmethod
    def parse(cls, flag: str) -> "Split":
        """CHUNK[:staged][:carried] (profile --split-attention)."""
        chunk, *on = flag.split(":")
        if not chunk.isdigit() or on != [k for k in KNOBS if k in on]:
            raise BadInput(f"--split-attention {flag}: expected CHUNK[:staged][:carried], e.g. 32 or 32:staged:carried")
        return cls(int(chunk), **{k: k in on for k in KNOBS})


KNOBS = ("staged", "carried")      # the family's switches, in the flag's order


def split_sdpa(q, k, v, chunk: int, total: int, staged: bool = False, carried: bool = False):
    """Attention of q (B, H, 1, Hd) over k, v (B, KvH, L, Hd), L <= total (variable), grouped query heads
    sharing each key head, by chunks of `chunk` positions of a sequence padded to `total`; `staged`
    writes each chunk's maximum, sum and weighted values to their own buffers before the combine;
    `carried` sums the exponentials as a column of ones beside the values, in the same reductions."""
    from tinygrad import Tensor
    B, H, _, Hd = q.shape
    KvH, L = k.shape[1], k.shape[2]
    G, C = H // KvH, total // chunk
    n = (L + chunk - 1) // chunk                                   # chunks that hold a position so far
    pad = ((0, 0), (0, 0), (0, total - L), (0, 0))
    # Key heads keep an axis of 1 for their query group. (Shrinking the chunks of a (B, KvH, C, chunk, Hd)
    # view and broadcasting it later sent tinygrad 0.13.0's code generator into endless recursion for
    # some head counts: 3 key heads of 3 queries each, 512 positions in chunks of 32.)
    kc = k.pad(pad).reshape(B, KvH, 1, C, chunk, Hd)[:, :, :, 0:n]          # (B, KvH, 1, n, chunk, Hd)
    vc = v.pad(pad).reshape(B, KvH, 1, C, chunk, Hd)[:, :, :, 0:n]
    s = (q.float().reshape(B, KvH, G, 1, 1, Hd) * kc.float()).sum(-1) * (1.0 / Hd ** 0.5)   # scores in float32
    s = s.reshape(B, H, s.shape[3], chunk)                                   # (B, H, n, chunk)
    s = (Tensor.arange(total, device=q.device).reshape(C, chunk)[0:n] < L).where(s, float("-inf"))
    stage = (lambda t: t.contiguous()) if staged else (lambda t: t)
    m = stage(s.max(-1))                                                     # each chunk's maximum
    p = (s - m.unsqueeze(-1)).exp()
    vf = vc.float().pad(((0, 0),) * 5 + ((0, 1),), value=1.0) if carried else vc.float()   # carried: ones beside
    width = vf.shape[-1]
    vh = vf.expand(B, KvH, G, vc.shape[3], chunk, width).reshape(B, H, vc.shape[3], chunk, width)
    o = stage((p.unsqueeze(-1) * vh).sum(-2))                                # (B, H, n, Hd[+1])
    w = (m - m.max(-1, keepdim=True)).exp()                                  # the combine: one softmax over all chunks
    if carried:                                                              # each chunk's sum is o's last column
        out = (o * w.unsqueeze(-1)).sum(-2)
        out = out[..., :Hd] / out[..., Hd:]
    else:
        total_p = stage(p.sum(-1))                                           # (B, H, n)
        out = (o * w.unsqueeze(-1)).sum(-2) / (total_p * w).sum(-1).unsqueeze(-1)
    return out.reshape(B, H, 1, Hd).cast(q.dtype)


@dataclass(frozen=True)
class Scheduled:
    """One kernel the compiler schedules for a block's decode attention: its output elements, and
    whether it reads the KV cache."""
    outputs: int
    reads_cache: bool


@functools.cache
def scheduled(split: Split, heads: int, kv_heads: int, head_dim: int, positions: int, depth: int) -> tuple[Scheduled, ...]:
    """The kernels tinygrad's scheduler makes of one block's decode attention in this setting, at these
    head counts, a cache of `positions` and a query at `depth`: asked on the CPU, nothing run."""
    from tinygrad import Context, Device, Tensor, UOp
    from boltbeam.search.compiler import outputs_at
    total = -(-positions // split.chunk) * split.chunk
    with Context(DEV="CPU"):    # on another default device, the bound position would be a kernel and a copy
        cache = Tensor.empty(2, 1, kv_heads, total, head_dim, device="CPU", dtype="half")
        p = UOp.variable("start_pos", 0, total - 1).bind(min(depth, total - 1))
        q = Tensor.empty(1, heads, 1, head_dim, device="CPU", dtype="half")
        out = split_sdpa(q, cache[0, :, :, 0:p + 1], cache[1, :, :, 0:p + 1], split.chunk, total, split.staged,
                         split.carried)
        linear, var_vals = out.linear_with_vars()
    renderer = Device["CPU"].renderer
    return tuple(Scheduled(outputs_at(call.src[0], renderer, var_vals), any(b is cache.uop.base for b in call.src[1:]))
                 for call in linear.src)


@contextlib.contextmanager
def _split_decode_attention(split: Split, total: int, taken):
    """Within the block's attention: a decode step's attention (one query, no mask) goes by chunks;
    `taken()` is called each time it does."""
    from tinygrad import Tensor
    original = Tensor.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False):
        if attn_mask is None and not is_causal and q.shape[2] == 1 and q.shape[1] % k.shape[1] == 0:
            taken()
            return split_sdpa(q, k, v, split.chunk, total, split.staged, split.carried)
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa)

    Tensor.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        Tensor.scaled_dot_product_attention = original


def install(net, census, model_path: str, setting: Split) -> Prepared:
    """Wrap every block's attention so its decode steps split over the sequence as `setting` says."""
    t0 = time.perf_counter()
    prepared = Prepared(FAMILY, asdict(setting))
    total = -(-net.max_context // setting.chunk) * setting.chunk     # the cache's positions, whole chunks
    split_blocks: set[int] = set()
    for i, block in enumerate(getattr(net, "blk", [])):
        attention = getattr(block, "_attention", None)
        if attention is None:
            continue
        prepared.eligible += 1

        def taken(i=i):   # a block counts once it has run a decode step's attention by chunks
            split_blocks.add(i)
            prepared.applied = len(split_blocks)

        def split(x, start_pos, attention=attention, taken=taken):
            with _split_decode_attention(setting, total, taken):
                return attention(x, start_pos)
        block._attention = split
    if not prepared.eligible:
        raise BadInput(f"model {model_path}: no block computes attention: nothing to split")
    prepared.seconds = time.perf_counter() - t0
    return prepared
