"""Tensor roles, from GGUF's own naming conventions (gguf.constants), never from a model's name.

A tensor's role is found by matching its name against the patterns that `gguf.constants` lists for
the file's architecture (TENSOR_NAMES restricted to MODEL_TENSORS[arch]); the tensor kind is then
mapped to a BoltBeam role below. A kind BoltBeam has no role for, or a name matching no pattern,
stays unclassified: BoltBeam refuses rather than guesses.
"""
from __future__ import annotations

import re
from functools import cache

from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

T = MODEL_TENSOR
# role -> (how a decode token reads it, the GGUF tensor kinds that play it)
#   row: one row per token (an embedding lookup); table: the whole table;
#   vector: a norm scale or bias, read whole; experts: only the experts a token is routed to.
ROLES: dict[str, tuple[str, tuple[MODEL_TENSOR, ...]]] = {
    "token_embd":     ("row",     (T.TOKEN_EMBD,)),
    "attn_q":         ("table",   (T.ATTN_Q,)),
    "attn_k":         ("table",   (T.ATTN_K,)),
    "attn_v":         ("table",   (T.ATTN_V,)),
    "attn_qkv":       ("table",   (T.ATTN_QKV,)),
    "attn_output":    ("table",   (T.ATTN_OUT,)),
    "attn_q_a":       ("table",   (T.ATTN_Q_A,)),
    "attn_q_b":       ("table",   (T.ATTN_Q_B,)),
    "attn_kv_a":      ("table",   (T.ATTN_KV_A_MQA,)),
    "attn_kv_b":      ("table",   (T.ATTN_KV_B, T.ATTN_K_B, T.ATTN_V_B)),
    "attn_gate":      ("table",   (T.ATTN_GATE,)),
    "ffn_gate":       ("table",   (T.FFN_GATE,)),
    "ffn_up":         ("table",   (T.FFN_UP,)),
    "ffn_down":       ("table",   (T.FFN_DOWN,)),
    "moe_router":     ("table",   (T.FFN_GATE_INP, T.FFN_GATE_INP_SHEXP)),
    "expert_gate":    ("experts", (T.FFN_GATE_EXP,)),
    "expert_up":      ("experts", (T.FFN_UP_EXP,)),
    "expert_gate_up": ("experts", (T.FFN_GATE_UP_EXP,)),
    "expert_down":    ("experts", (T.FFN_DOWN_EXP,)),
    "shared_gate":    ("table",   (T.FFN_GATE_SHEXP,)),
    "shared_up":      ("table",   (T.FFN_UP_SHEXP,)),
    "shared_down":    ("table",   (T.FFN_DOWN_SHEXP,)),
    "output":         ("table",   (T.OUTPUT,)),
    "attn_q_norm":    ("vector",  (T.ATTN_Q_NORM,)),
    "attn_k_norm":    ("vector",  (T.ATTN_K_NORM,)),
    "attn_norm":      ("vector",  (T.ATTN_NORM, T.ATTN_NORM_2, T.ATTN_Q_A_NORM, T.ATTN_KV_A_NORM)),
    "post_attn_norm": ("vector",  (T.ATTN_POST_NORM, T.ATTN_OUT_NORM)),
    "ffn_norm":       ("vector",  (T.FFN_NORM, T.FFN_PRE_NORM)),
    "post_ffn_norm":  ("vector",  (T.FFN_POST_NORM, T.LAYER_OUT_NORM)),
    "output_norm":    ("vector",  (T.OUTPUT_NORM,)),
    "moe_router_bias": ("vector", (T.FFN_EXP_PROBS_B,)),
    "rope_freqs":     ("vector",  (T.ROPE_FREQS,)),
    "attn_sinks":     ("vector",  (T.ATTN_SINKS,)),
}
ROLE_OF_KIND = {kind: role for role, (_, kinds) in ROLES.items() for kind in kinds}

# Regions of a token, for comparing two engines region by region.
REGIONS = {
    "qkv": ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_q_a", "attn_q_b", "attn_kv_a", "attn_kv_b"),
    "attn_output": ("attn_output", "attn_gate"),
    "gate_up": ("ffn_gate", "ffn_up", "expert_gate", "expert_up", "expert_gate_up", "shared_gate",
                "shared_up", "moe_router"),
    "down": ("ffn_down", "expert_down", "shared_down"),
    "norms": ("attn_q_norm", "attn_k_norm", "attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm",
              "output_norm"),
    "vocabulary": ("output",),
}
REGION_OF_ROLE = {role: region for region, roles in REGIONS.items() for role in roles}

# Roles whose tables one block multiplies by the same input (the block's normed hidden state): a
# route may stack them into one product. Correctness never rests on this; only the saving does.
SHARED_INPUT = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("shared_gate", "shared_up"))

# The norms (by tensor kind) whose output only tables of these roles read, in the norm's block (or, for
# the model's last norm, outside every block): a route may fold such a norm into those products, and only
# where it folds it into every one of them.
NORM_READERS: dict[MODEL_TENSOR, tuple[str, ...]] = {
    T.ATTN_NORM: ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_q_a", "attn_kv_a", "attn_gate"),
    T.FFN_NORM: ("ffn_gate", "ffn_up", "moe_router", "expert_gate", "expert_up", "expert_gate_up",
                 "shared_gate", "shared_up"),
    T.OUTPUT_NORM: ("output",),
}


def norm_kind(name: str, block: int | None) -> MODEL_TENSOR | None:
    """The kind of NORM_READERS a tensor of this name (in this block) is the weight of, if any."""
    return next((k for k in NORM_READERS if f"{TENSOR_NAMES[k].format(bid=block)}.weight" == name), None)


def read_kind(role: str | None) -> str:
    """How a decode token reads a tensor of this role; an unclassified tensor counts as read whole."""
    return ROLES[role][0] if role else "table"


def arch_of(name: str) -> MODEL_ARCH | None:
    return next((a for a, n in MODEL_ARCH_NAMES.items() if n == name), None)


@cache
def _patterns(arch: MODEL_ARCH) -> list[tuple[re.Pattern, MODEL_TENSOR]]:
    pats = []
    for kind in MODEL_TENSORS.get(arch, ()):
        base = re.escape(TENSOR_NAMES[kind]).replace(re.escape("{bid}"), r"(?P<bid>\d+)")
        pats.append((re.compile(rf"{base}(?:\.(?:weight|bias))?"), kind))
    return pats


def classify(tensor_name: str, arch: MODEL_ARCH | None) -> tuple[str | None, int | None]:
    """(role, block index) of a tensor, or (None, None) when it cannot be classified."""
    if arch is None:
        return None, None
    for pat, kind in _patterns(arch):
        if m := pat.fullmatch(tensor_name):
            bid = m.groupdict().get("bid")
            return ROLE_OF_KIND.get(kind), int(bid) if bid is not None else None
    return None, None
