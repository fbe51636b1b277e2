"""Write a synthetic GGUF from an architecture description and a tensor mix rule.

Quant blocks are random bytes with their fp16 scale fields overwritten by small finite values
(formats.toml says where those fields sit), so no block is all zeros and no scale is inf or NaN.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.constants import MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

from boltbeam.bound.roofline import formats
from boltbeam.errors import BadInput
from boltbeam.files import atomic_path
from boltbeam.read.roles import arch_of
from boltbeam.synth.shapes import Shape, shape_from

Q = GGMLQuantizationType
T = MODEL_TENSOR


# --- tensor mix rules: (tensor kind, block index, block count) -> weight format --------------
def _more_bits(i: int, n: int) -> bool:
    # llama.cpp's use_more_bits: the first and last eighth of the blocks, and every third between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _q4_k_m(kind: MODEL_TENSOR, i: int, n: int) -> Q:
    if kind == T.OUTPUT:
        return Q.Q6_K
    if kind in (T.ATTN_V, T.FFN_DOWN) and _more_bits(i, n):
        return Q.Q6_K
    return Q.Q4_K


MIXES: dict[str, tuple[Callable[[MODEL_TENSOR, int, int], Q], LlamaFileType]] = {
    "q4_k_m": (_q4_k_m, LlamaFileType.MOSTLY_Q4_K_M),
    "q8_0": (lambda k, i, n: Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (lambda k, i, n: Q.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "f16": (lambda k, i, n: Q.F16, LlamaFileType.MOSTLY_F16),
}

# The dense decoder's tensors: (kind, ne0, ne1) as functions of the shape; ne1 == 0 marks a vector.
_GLOBAL = [(T.TOKEN_EMBD, lambda s: (s.embedding, s.vocabulary)),
           (T.OUTPUT_NORM, lambda s: (s.embedding, 0)),
           (T.OUTPUT, lambda s: (s.embedding, s.vocabulary))]
_BLOCK = [(T.ATTN_NORM, lambda s: (s.embedding, 0)),
          (T.ATTN_Q, lambda s: (s.embedding, s.heads * s.head_dim)),
          (T.ATTN_Q_NORM, lambda s: (s.head_dim, 0)),
          (T.ATTN_K, lambda s: (s.embedding, s.kv_heads * s.head_dim)),
          (T.ATTN_K_NORM, lambda s: (s.head_dim, 0)),
          (T.ATTN_V, lambda s: (s.embedding, s.kv_heads * s.head_dim)),
          (T.ATTN_OUT, lambda s: (s.heads * s.head_dim, s.embedding)),
          (T.FFN_NORM, lambda s: (s.embedding, 0)),
          (T.FFN_GATE, lambda s: (s.embedding, s.ffn)),
          (T.FFN_UP, lambda s: (s.embedding, s.ffn)),
          (T.FFN_DOWN, lambda s: (s.ffn, s.embedding))]


@dataclass(frozen=True)
class Planned:
    name: str
    ne0: int
    ne1: int        # 0 for a vector
    qtype: Q

    @property
    def nbytes(self) -> int:
        elems, size = GGML_QUANT_SIZES[self.qtype]
        return self.ne0 * max(self.ne1, 1) // elems * size


def plan(arch: str, shape: Shape, mix: str, tied: bool = False) -> list[Planned]:
    garch = arch_of(arch)
    if garch is None:
        raise BadInput(f"unknown architecture {arch!r} (not in gguf's MODEL_ARCH_NAMES)")
    if mix not in MIXES:
        raise BadInput(f"unknown mix {mix!r}; known: {', '.join(MIXES)}")
    rule = MIXES[mix][0]
    kinds = set(MODEL_TENSORS[garch])
    n = shape.blocks
    out = []

    def add(kind: MODEL_TENSOR, dims: tuple[int, int], i: int) -> None:
        if kind not in kinds or (tied and kind == T.OUTPUT):
            return
        ne0, ne1 = dims
        qtype = Q.F32 if ne1 == 0 else rule(kind, i, n)
        if ne0 % GGML_QUANT_SIZES[qtype][0]:
            raise BadInput(f"{TENSOR_NAMES[kind].format(bid=i)}: row of {ne0} elements is not a whole "
                           f"number of {qtype.name} blocks ({GGML_QUANT_SIZES[qtype][0]})")
        out.append(Planned(TENSOR_NAMES[kind].format(bid=i) + ".weight", ne0, ne1, qtype))

    add(_GLOBAL[0][0], _GLOBAL[0][1](shape), 0)
    for i in range(n):
        for kind, dims in _BLOCK:
            add(kind, dims(shape), i)
    for kind, dims in _GLOBAL[1:]:
        add(kind, dims(shape), 0)
    return out


def _data(p: Planned, rng: np.random.Generator) -> np.ndarray:
    if p.qtype == Q.F32:
        return (1.0 + 0.05 * rng.standard_normal(p.ne0)).astype(np.float32)
    if p.qtype == Q.F16:
        return (rng.standard_normal((p.ne1, p.ne0)) / np.sqrt(p.ne0)).astype(np.float16)
    elems, size = GGML_QUANT_SIZES[p.qtype]
    blocks = np.frombuffer(rng.bytes(p.nbytes), dtype=np.uint8).reshape(-1, size).copy()
    for off in formats()[p.qtype.name]["half_fields"]:
        scales = rng.uniform(5e-5, 1.5e-4, len(blocks)).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(p.ne1, p.ne0 // elems * size)


def _vocabulary(n: int) -> Iterator[str]:
    # Byte-level tokens first (what a gpt2-style BPE vocabulary starts with), then filler tokens.
    for b in range(min(n, 256)):
        yield f"<0x{b:02X}>"
    for i in range(256, n):
        yield f"tok{i}"


def write(out: str | os.PathLike, arch: str, shape: Shape, mix: str, seed: int = 0, tied: bool = False,
          progress: Callable[[int], None] | None = None) -> list[Planned]:
    """Write the file all or nothing (files.atomic_path). `progress` receives bytes written."""
    planned = plan(arch, shape, mix, tied)
    rng = np.random.default_rng(seed)
    with atomic_path(out) as tmp:
        w = GGUFWriter(tmp, arch)
        w.add_name(f"boltbeam synthetic {arch} {mix}")
        w.add_description("random but valid quant blocks; shape-true, not a trained model")
        w.add_file_type(MIXES[mix][1])
        w.add_quantization_version(2)
        w.add_block_count(shape.blocks)
        w.add_context_length(shape.context_length)
        w.add_embedding_length(shape.embedding)
        w.add_feed_forward_length(shape.ffn)
        w.add_head_count(shape.heads)
        w.add_head_count_kv(shape.kv_heads)
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
        w.add_rope_freq_base(1e6)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_tokenizer_model("gpt2")
        w.add_token_list(list(_vocabulary(shape.vocabulary)))
        w.add_token_types([1] * shape.vocabulary)
        w.add_token_merges(["<0x61> <0x62>"])   # llama.cpp needs at least one merge for a gpt2 vocabulary
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        for p in planned:
            if p.qtype in (Q.F32, Q.F16):
                dtype = np.float32 if p.qtype == Q.F32 else np.float16
                w.add_tensor_info(p.name, (p.ne0,) if p.ne1 == 0 else (p.ne1, p.ne0), np.dtype(dtype), p.nbytes)
            else:
                row_bytes = p.ne0 // GGML_QUANT_SIZES[p.qtype][0] * GGML_QUANT_SIZES[p.qtype][1]
                w.add_tensor_info(p.name, (p.ne1, row_bytes), np.dtype(np.uint8), p.nbytes, raw_dtype=p.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for p in planned:
            w.write_tensor_data(_data(p, rng))
            if progress:
                progress(p.nbytes)
        w.close()
    return planned


def write_calibration(out: str | os.PathLike, width: int, blocks: int) -> None:
    """A decoder for measuring what the host costs per token (measure/launch_cost): heads of 128, an
    FFN three times the width (rows stay whole k-quant blocks of 256), a 256-token vocabulary and a
    64-position context, in the one dense architecture with per-head q/k norms the benchmarks use."""
    heads = width // 128
    shape = shape_from(None, blocks=blocks, embedding=width, heads=heads, kv_heads=max(1, heads // 4), head_dim=128,
                       ffn=3 * width if width > 256 else 256, vocabulary=256, context_length=64)
    write(out, "qwen3", shape, "q4_k_m")
