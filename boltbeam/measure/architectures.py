"""The formula a file's architecture computes where tinygrad.llm lacks it, given as tinygrad tensor code.

tinygrad.llm builds every attention-and-feed-forward file with one block formula (TransformerBlock): pre-norms,
a SiLU-gated feed-forward, causal attention over every position at one rotary base, the embedding as looked
up. A file whose architecture computes more is fitted here once tinygrad has loaded it (tinygrad still runs
all of the math), each change keyed to a fact:

- facts the file states: post-attention and post-feed-forward norm tensors (each applied to its sub-layer's
  output before the residual add); a sliding window (its blocks attend to the last `window` positions, at
  their own rotary base); a linear rope scaling (the other blocks' positions scaled). A logit soft-cap or a
  rope scaling of another kind is refused: nothing here computes it.
- facts its architecture fixes and the file does not state (the feed-forward's activation, the embedding's
  scale, which blocks slide and their rotary base when the file has no key for them): data/architectures.toml,
  each from llama.cpp's source.

What needs no change: norm weights are used as stored (llama.cpp's converter adds one to weights the original
stores as offsets from one, and llama.cpp multiplies by them as they are); q/k norms over a head are
tinygrad.llm's own; the attention's scale, llama.cpp's 1/sqrt(key_length), is scaled_dot_product_attention's
1/sqrt(head size); the output tied to the embedding is tinygrad.llm's own.

Each block is given a class of its own with only the methods whose formula differs, so the route families'
checks of a block's formula by its methods (route/rotary.py: unfit; route/fusion.py: _dense_feed_forward) see
exactly which differ and refuse that block, not the model.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from gguf import Keys
from tinygrad import Tensor, function, nn
from tinygrad.llm import model
from tinygrad.llm.model import TransformerBlock, apply_rope

from boltbeam.errors import Refused
from boltbeam.read.census import Census, architecture_facts

ACTIVATIONS = {"silu": lambda x: x.silu(), "gelu_tanh": lambda x: x.gelu(approximate="tanh")}
SCALES = {"sqrt_width": lambda width: math.sqrt(width)}


@dataclass(frozen=True)
class Formula:
    """What a file computes beyond tinygrad.llm's TransformerBlock (the defaults: nothing)."""
    activation: str = "silu"
    embedding_scale: float = 1.0
    post_norms: bool = False
    window: int = 0                                     # positions a sliding block attends to (0: none slides)
    sliding: frozenset[int] = field(default_factory=frozenset)
    sliding_rope_base: float = 0.0
    rope_scale: float = 1.0                             # the full blocks' positions times this (linear scaling)

    @property
    def plain(self) -> bool:
        return self == Formula()


def _stated(census: Census, key: str):
    """The file's value for a `{arch}.` key of gguf.Keys (None where the file has none)."""
    return census.hyperparameters.get(key.split(".", 1)[1])


def formula_of(census: Census) -> Formula:
    """The formula the file's facts, and its architecture's where the file is silent, call for."""
    K, R = Keys.LLM, Keys.Rope
    capped = [f"{k.split('.', 1)[1]} = {v}" for k in (K.FINAL_LOGIT_SOFTCAPPING, K.ATTN_LOGIT_SOFTCAPPING)
              if (v := _stated(census, k))]
    if capped:
        raise Refused(f"model {census.path}: the file states a logit soft-cap ({', '.join(capped)}); neither "
                      f"tinygrad.llm nor BoltBeam's adapter computes one (adapter-incomplete)")
    arch = architecture_facts(census.architecture)
    f = census.facts
    post = {t.role for t in census.tensors} & {"post_attn_norm", "post_ffn_norm"}
    if len(post) == 1:
        raise Refused(f"model {census.path}: only {post.pop()} of the two post-norms; BoltBeam's adapter applies "
                      f"both or none (adapter-incomplete)")
    sliding = frozenset(f.swa_blocks if f.sliding_window else ())
    base = _stated(census, R.FREQ_BASE_SWA) or arch.get("rope_freq_base_swa") or _stated(census, R.FREQ_BASE)
    scaling = _stated(census, R.SCALING_TYPE)
    if scaling not in (None, "none", "linear"):
        raise Refused(f"model {census.path}: rope scaling {scaling!r}; BoltBeam's adapter computes linear scaling "
                      f"only (adapter-incomplete)")
    return Formula(
        activation=arch.get("feed_forward", "silu"),
        embedding_scale=SCALES[arch["embedding_scale"]](f.embedding) if "embedding_scale" in arch else 1.0,
        post_norms=bool(post),
        window=int(f.sliding_window or 0) if sliding else 0, sliding=sliding,
        sliding_rope_base=float(base) if sliding else 0.0,
        rope_scale=1.0 / float(_stated(census, R.SCALING_FACTOR) or 1.0) if scaling == "linear" else 1.0)


def load(path, max_context: int, census: Census):
    """tinygrad.llm's Transformer for the file, fitted to its formula (fit)."""
    held: dict = {}
    original = model.gguf_load

    def keep(fn):       # the file's tensors, the ones tinygrad.llm drops included, as views of its one load
        kv, state = original(fn)
        held.update(state)
        return kv, state

    model.gguf_load = keep
    try:
        net, _ = model.Transformer.from_gguf(path, max_context)
    finally:
        model.gguf_load = original
    fit(net, formula_of(census), held)
    return net


def fit(net, formula: Formula, tensors: dict) -> None:
    """Give every block and the embedding the formula's changes; `tensors`: the file's, by GGUF name."""
    if formula.plain:
        return
    if any(type(b) is not TransformerBlock for b in net.blk):
        raise Refused(f"blocks of {sorted({type(b).__name__ for b in net.blk} - {'TransformerBlock'})}: BoltBeam's "
                      f"adapter fits only tinygrad.llm's TransformerBlock (adapter-incomplete)")
    if formula.sliding and net.blk[0].config.attn_output_gate:
        raise Refused("a sliding window on gated attention: BoltBeam's adapter windows only ungated attention "
                      "(adapter-incomplete)")
    for i, block in enumerate(net.blk):
        c = block.config
        sliding = i in formula.sliding
        if formula.post_norms:
            dtype = block.attn_norm.weight.dtype
            for name in ("post_attention_norm", "post_ffw_norm"):
                norm = nn.RMSNorm(c.dim, c.norm_eps)
                norm.weight = tensors[f"blk.{i}.{name}.weight"].cast(dtype)
                setattr(block, name, norm)
        if sliding:
            block.config, block.window = replace(c, rope_theta=formula.sliding_rope_base), formula.window
        block.rope_scale = 1.0 if sliding else formula.rope_scale
        block.activation = formula.activation
        block.__class__ = _block_class(formula.post_norms, formula.activation != "silu", sliding,
                                       block.rope_scale != 1.0)
    if formula.embedding_scale != 1.0:
        net.token_embd.__class__, net.token_embd.scale = ScaledEmbedding, formula.embedding_scale


@functools.cache
def _block_class(post_norms: bool, activation: bool, sliding: bool, scaled: bool) -> type:
    """TransformerBlock with only the methods whose formula differs replaced."""
    methods = {"__call__": _post_normed_call} if post_norms else {}
    if activation:
        methods["_feed_forward"] = _feed_forward
    if sliding:
        methods["_attention"] = _windowed_attention
    if scaled:
        methods["_init_state"] = _scaled_init_state
    return type("FittedBlock", (TransformerBlock,), methods)


def _post_normed_call(self, x, start_pos):
    """FFNBlock.__call__ with each sub-layer's output normed before its residual add."""
    self._init_state(x)

    @function(precompile=True, allow_implicit=True)
    def _run(x, start_pos):
        h = x + self.post_attention_norm(self._attention(self.attn_norm(x), start_pos))
        return (h + self.post_ffw_norm(self._feed_forward(self.ffn_norm(h)))).contiguous()
    return _run(x, start_pos)


def _feed_forward(self, x):
    """The dense gated feed-forward with the file's activation in place of SiLU."""
    return self.ffn_down(ACTIVATIONS[self.activation](self.ffn_gate(x)).contiguous() * self.ffn_up(x))


def _windowed_attention(self, x, start_pos):
    """TransformerBlock._attention (no output gate) where a position attends to the last `window` positions
    only: a key at p0 is masked from a query at p1 where p1 - p0 >= window (llama.cpp's is_masked_swa, its
    standard sliding window), at every step, a decode step's included."""
    c = self.config
    B, T, _ = x.shape
    q, k, v = self.attn_q(x), self.attn_k(x), self.attn_v(x)
    if c.qk_norm and c.qk_norm != c.head_dim:
        q, k = self.attn_q_norm(q), self.attn_k_norm(k)
    q = q.reshape(B, T, c.n_heads, c.head_dim).transpose(1, 2)
    k = k.reshape(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
    v = v.reshape(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
    if c.qk_norm == c.head_dim:
        q, k = self.attn_q_norm(q), self.attn_k_norm(k)
    freqs = self.freqs_cis[start_pos:start_pos + T]
    q = apply_rope(q[..., :c.rope_dim], freqs).cat(q[..., c.rope_dim:], dim=-1)
    k = apply_rope(k[..., :c.rope_dim], freqs).cat(k[..., c.rope_dim:], dim=-1)
    stored = self.cache_kv[:, :, :, start_pos:start_pos + T, :].uop.store(Tensor.stack(k, v).uop)
    kv = Tensor(self.cache_kv.uop.after(stored))
    attn = q.scaled_dot_product_attention(kv[0, :, :, 0:start_pos + T, :], kv[1, :, :, 0:start_pos + T, :],
                                          attn_mask=window_mask(T, start_pos, self.window, x), enable_gqa=True)
    return self.attn_output(attn.transpose(1, 2).reshape(B, T, -1))


def window_mask(T, start_pos, window: int, like: Tensor) -> Tensor:
    """(1, 1, T, start_pos + T): -inf where the query at start_pos + t may not see the key at p0 (a later
    position, or one `window` or more before it), 0 elsewhere."""
    full = lambda: Tensor.full((1, 1, T, start_pos + T), float("-inf"), dtype=like.dtype, device=like.device,
                               buffer=False)
    return full().triu(start_pos + 1) + full().tril(start_pos - window)


def _scaled_init_state(self, x):
    """TransformerBlock._init_state with the rotary angles at positions times `rope_scale` (linear scaling)."""
    if hasattr(self, "cache_kv"):
        return
    TransformerBlock._init_state(self, x)
    c = self.config
    inv = 1.0 / (c.rope_theta ** (Tensor.arange(0, c.rope_dim, 2, device=x.device)[:c.rope_dim // 2] / c.rope_dim))
    angles = (Tensor.arange(c.max_context, device=x.device) * self.rope_scale).unsqueeze(1) * inv.unsqueeze(0)
    self.freqs_cis = angles.cos().cat(angles.sin(), dim=-1).contiguous()


class ScaledEmbedding(nn.Embedding):
    """nn.Embedding's lookup, in float32, times `scale`."""
    def __call__(self, idx: Tensor) -> Tensor:
        return super().__call__(idx).float() * self.scale
