"""Which tensor each of llama.cpp's kernels reads, found from facts: the census, the order a block
computes its products, and each kernel's launch grid. No tensor name reaches the device's records.

A token runs, block after block, the matrix products of the block's weight tables in the order a
block computes them (`roles.ROLES` lists a standard attention and feed-forward block's in that order;
a block that computes its tables in another order, or a mixture of experts, does not align and is
refused), then the output projection. A kernel is a product
when ggml's CUDA back end named it after its op (`mul_mat`): that names the operation, not the tensor.
Which tensors it reads is then fixed by order and shape: the products of a token, in start order,
are aligned with the tensors in compute order, each product taking one tensor, or two adjacent ones
of the same shape and format that it computes together (llama.cpp fuses gate and up), and the
product's grid must hold the tensor's rows at one fixed number of rows per group throughout the
token. A token that aligns in no way, or in more than one, is not guessed: its kernels keep no role
and the trace says so.
Kernels that read no weight get a category from their op.
"""
from __future__ import annotations

import dataclasses
from functools import cache

from boltbeam.measure.trace import Trace
from boltbeam.read.census import Census, TensorEntry
from boltbeam.read.roles import ROLES

PRODUCT_OP = "mul_mat"
# ggml ops in a kernel's name -> the trace's category for a kernel that reads no weight.
CATEGORY_OF_OP = (("flash_attn", "attention"), ("soft_max", "attention"), ("rms_norm", "norm"), ("norm", "norm"),
                  ("rope", "rope"), ("set_rows", "kv_write"), ("cpy", "copy"), ("get_rows", "other"),
                  ("argmax", "sampling"))
ORDER = {role: i for i, role in enumerate(ROLES)}


def products_in_order(census: Census) -> list[TensorEntry]:
    """The weight tables a decode token multiplies by, in the order it computes them."""
    tables = [t for t in census.tensors if t.role and ROLES[t.role][0] == "table"]
    return sorted(tables, key=lambda t: (t.block is None, t.block or 0, ORDER[t.role]))


def rows(t: TensorEntry) -> int:
    return t.shape[1] if len(t.shape) > 1 else 1


def align(grids: list[int], tensors: list[TensorEntry]) -> list[list[TensorEntry]] | None:
    """Each product's tensors (one, or two adjacent of one shape and format), with every product's
    grid holding its tensors' rows at one rows-per-group; None when no alignment exists, or more than one."""
    if not grids or not tensors or rows(tensors[0]) % grids[0]:
        return None
    per_group = rows(tensors[0]) // grids[0]
    n, m = len(grids), len(tensors)

    def fits(i: int, j: int, size: int) -> bool:
        group = tensors[j:j + size]
        return (len(group) == size and rows(group[0]) == grids[i] * per_group
                and all(t.shape == group[0].shape and t.format == group[0].format and t.block == group[0].block
                        for t in group))

    @cache
    def ways(i: int, j: int) -> int:   # alignments of products i.. with tensors j.., counted up to two
        if i == n or j == m:
            return int(i == n and j == m)
        return min(2, sum(ways(i + 1, j + size) for size in (1, 2) if fits(i, j, size)))

    if ways(0, 0) != 1:
        return None
    out, j = [], 0
    for i in range(n):
        size = next(size for size in (1, 2) if fits(i, j, size) and ways(i + 1, j + size))
        out.append(tensors[j:j + size])
        j += size
    return out


def category_of(name: str) -> str:
    return next((cat for op, cat in CATEGORY_OF_OP if op in name), "other")


def assign(trace: Trace, tensors: list[TensorEntry]) -> Trace:
    """The trace with every product kernel's role, tensors and bytes, and every other kernel's category;
    `tensors`: the model's weight tables in compute order (`products_in_order`)."""
    kernels, failed = [], []
    for token, ks in trace.by_token().items():
        products = [k for k in ks if PRODUCT_OP in k.name]
        groups = align([(k.global_size or [1])[0] for k in products], tensors)
        if groups is None:
            failed.append(token)
        of = dict(zip((id(k) for k in products), groups or []))
        for k in ks:
            if id(k) in of:
                g = of[id(k)]
                kernels.append(dataclasses.replace(k, role=g[0].role, category="weights", tensors=[t.name for t in g],
                                                   bytes=sum(t.bytes_per_token for t in g)))
            else:
                kernels.append(dataclasses.replace(k, category="other" if PRODUCT_OP in k.name else category_of(k.name)))
    notes = list(trace.provenance.notes or [])
    if failed:
        notes.append(f"adapter-incomplete: the products of token(s) {failed} did not align, or aligned more than one "
                     f"way, with the model's {len(tensors)} weight tables in compute order: their kernels keep no role")
    else:
        notes.append(f"roles from facts: each token's {len(tensors)} weight tables in compute order aligned with its "
                     f"product kernels by launch grid")
    return dataclasses.replace(trace, kernels=kernels, provenance=dataclasses.replace(trace.provenance, notes=notes))
