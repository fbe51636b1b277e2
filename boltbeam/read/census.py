"""The census: every tensor of a GGUF file, its role, format and the bytes a decode token reads.

Reads only the header and tensor table (memory-mapped); no tensor data is touched.
"""
from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, Keys

from boltbeam.errors import BadInput
from boltbeam.read.gguf_file import open_gguf, scalar
from boltbeam.read.roles import arch_of, classify, read_kind


@dataclass(frozen=True)
class Format:
    name: str
    ggml_type: int
    block_elements: int
    block_bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.block_bytes / self.block_elements

    @staticmethod
    def of(ggml_type: int) -> "Format":
        q = GGMLQuantizationType(ggml_type)
        elems, nbytes = GGML_QUANT_SIZES[q]
        return Format(q.name, int(q), elems, nbytes)


@dataclass
class TensorEntry:
    name: str
    role: str | None
    format: str
    shape: list[int]          # GGUF order: elements per row first (ne0, ne1, ...)
    bytes: int                # in the file
    bytes_per_token: int      # read by one decode token
    block: int | None = None  # transformer block index, None for global tensors
    data_offset: int = 0      # absolute offset of its data in the file
    tied: bool = False        # True for the output projection that reuses the embedding table

    @property
    def rows(self) -> int:
        return self.shape[1] if len(self.shape) > 1 else 1

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class ModelFacts:
    """The workload's facts, from the file's own keys (or its tensor shapes where keys are absent)."""
    blocks: int
    embedding: int
    heads: int
    kv_heads: int
    head_dim: int
    value_dim: int
    vocabulary: int
    context_length: int | None = None
    sliding_window: int | None = None
    swa_blocks: list[int] = field(default_factory=list)  # blocks that read only their window of KV
    expert_count: int = 0
    expert_used: int = 0


@dataclass
class Census:
    path: str
    architecture: str
    hyperparameters: dict[str, Any]
    facts: ModelFacts
    tensors: list[TensorEntry]
    formats: dict[str, Format]
    unclassified: list[str]
    tied_embeddings: bool
    notes: list[str]
    file_tensor_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return sum(t.bytes_per_token for t in self.tensors)

    @property
    def adapter_incomplete(self) -> bool:
        return bool(self.unclassified)

    def roles(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.tensors:
            if t.role is None:
                continue
            r = out.setdefault(t.role, {"count": 0, "bytes": 0, "bytes_per_token": 0})
            r["count"] += 1
            r["bytes"] += 0 if t.tied else t.bytes
            r["bytes_per_token"] += t.bytes_per_token
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "architecture": self.architecture,
            "hyperparameters": self.hyperparameters,
            "facts": asdict(self.facts),
            "tensors": [
                {"name": t.name, "role": t.role, "format": t.format, "shape": t.shape, "bytes": t.bytes,
                 "bytes_per_token": t.bytes_per_token, "block": t.block, "tied": t.tied}
                for t in self.tensors],
            "formats": {n: {"ggml_type": f.ggml_type, "block_elements": f.block_elements,
                            "block_bytes": f.block_bytes, "bits_per_weight": f.bits_per_weight}
                        for n, f in self.formats.items()},
            "roles": self.roles(),
            "bytes_per_token": self.bytes_per_token,
            "file_tensor_bytes": self.file_tensor_bytes,
            "tied_embeddings": self.tied_embeddings,
            "unclassified": self.unclassified,
            "status": "adapter-incomplete" if self.adapter_incomplete else "complete",
            "notes": self.notes,
        }


@functools.cache
def architecture_facts(architecture: str) -> dict[str, Any]:
    """What an architecture fixes that its files do not state (data/architectures.toml); {} for none."""
    text = resources.files("boltbeam.data").joinpath("architectures.toml").read_text()
    return tomllib.loads(text).get(architecture, {})


def _key(reader, arch: str, key_template: str) -> Any:
    return scalar(reader, key_template.format(arch=arch))


def _facts(path: str | os.PathLike, reader, arch: str, tensors: list[TensorEntry]) -> ModelFacts:
    L, A = Keys.LLM, Keys.Attention
    by_role = {}
    for t in tensors:
        by_role.setdefault(t.role, t)
    embd = _key(reader, arch, L.EMBEDDING_LENGTH) or (by_role["token_embd"].shape[0] if "token_embd" in by_role else 0)
    heads = _key(reader, arch, A.HEAD_COUNT) or 0
    if isinstance(heads, list):  # per-layer head counts: the largest bounds the reads
        heads = max(heads)
    kv_heads = _key(reader, arch, A.HEAD_COUNT_KV) or heads
    if isinstance(kv_heads, list):
        kv_heads = max(kv_heads)
    head_dim = _key(reader, arch, A.KEY_LENGTH) or (embd // heads if heads else 0)
    value_dim = _key(reader, arch, A.VALUE_LENGTH) or head_dim
    vocab_table = by_role.get("output") or by_role.get("token_embd")
    vocab = _key(reader, arch, L.VOCAB_SIZE) or (vocab_table.rows if vocab_table else 0)
    blocks = _key(reader, arch, L.BLOCK_COUNT) or (1 + max((t.block for t in tensors if t.block is not None), default=-1))
    if not isinstance(blocks, int) or not 0 <= blocks <= len(tensors):   # a block holds one tensor at least
        raise BadInput(f"model {path}: the metadata says {blocks!r} blocks for {len(tensors)} tensors")
    window = _key(reader, arch, A.SLIDING_WINDOW)
    swa_blocks: list[int] = []
    if window:
        pattern = _key(reader, arch, A.SLIDING_WINDOW_PATTERN)
        if pattern is None:                  # the architecture's own, where the file states none
            pattern = architecture_facts(arch).get("sliding_window_pattern")
        if isinstance(pattern, list):        # one flag per block: True = sliding window
            swa_blocks = [i for i, on in enumerate(pattern) if on]
        elif isinstance(pattern, int) and pattern > 0:  # every pattern-th block attends fully
            swa_blocks = [i for i in range(blocks) if (i + 1) % pattern != 0]
        else:
            swa_blocks = list(range(blocks))
    return ModelFacts(
        blocks=int(blocks), embedding=int(embd), heads=int(heads), kv_heads=int(kv_heads),
        head_dim=int(head_dim), value_dim=int(value_dim), vocabulary=int(vocab),
        context_length=_key(reader, arch, L.CONTEXT_LENGTH), sliding_window=window, swa_blocks=swa_blocks,
        expert_count=int(_key(reader, arch, L.EXPERT_COUNT) or 0),
        expert_used=int(_key(reader, arch, L.EXPERT_USED_COUNT) or 0))


def _check_blocks(path: str | os.PathLike, declared: int, seen: set[int]) -> None:
    """The metadata's block count and the blocks the tensor table holds must be the same blocks."""
    if len(seen) != declared or (seen and (min(seen), max(seen)) != (0, declared - 1)):
        held = f"blocks {min(seen)} to {max(seen)} ({len(seen)} of them)" if seen else "no block's tensors"
        raise BadInput(f"model {path}: the metadata says {declared} block(s); the tensor table holds {held}")


def take_census(path: str | os.PathLike) -> Census:
    reader = open_gguf(path)
    arch = scalar(reader, "general.architecture") or "unknown"
    garch = arch_of(arch)
    notes: list[str] = []
    if garch is None:
        notes.append(f"architecture {arch!r} is not one the gguf package knows: no tensor can be classified")
    hyper = {k.split(".", 1)[1]: v for k in reader.fields
             if k.startswith(f"{arch}.") and (v := scalar(reader, k)) is not None}

    tensors: list[TensorEntry] = []
    formats: dict[str, Format] = {}
    unclassified: list[str] = []
    for rt in reader.tensors:
        fmt = Format.of(int(rt.tensor_type))
        formats[fmt.name] = fmt
        role, block = classify(rt.name, garch)
        if role is None:
            unclassified.append(rt.name)
        tensors.append(TensorEntry(name=rt.name, role=role, format=fmt.name, shape=[int(d) for d in rt.shape],
                                   bytes=int(rt.n_bytes), bytes_per_token=0, block=block,
                                   data_offset=int(rt.data_offset)))
    facts = _facts(path, reader, arch, tensors)
    if not unclassified:   # an unplaced tensor may be any block's: the model is adapter-incomplete anyway
        _check_blocks(path, facts.blocks, {t.block for t in tensors if t.block is not None})

    for t in tensors:
        kind = read_kind(t.role)
        if kind == "row":
            t.bytes_per_token = t.bytes // t.rows
        elif kind == "experts" and facts.expert_count and facts.expert_used:
            t.bytes_per_token = t.bytes * facts.expert_used // facts.expert_count
        else:
            if kind == "experts":
                notes.append(f"{t.name}: expert counts missing from the file; counted whole")
            t.bytes_per_token = t.bytes

    tied = not any(t.role == "output" for t in tensors)
    embd = next((t for t in tensors if t.role == "token_embd"), None)
    if tied and embd is not None:
        tensors.append(TensorEntry(name=embd.name, role="output", format=embd.format, shape=embd.shape,
                                   bytes=embd.bytes, bytes_per_token=embd.bytes, block=None,
                                   data_offset=embd.data_offset, tied=True))
        notes.append(f"tied embeddings: no output.weight; the output projection reads the whole "
                     f"{embd.name} table ({embd.bytes:,} bytes) every token, counted once as role 'output' "
                     f"beside the one row the embedding lookup reads")
    if unclassified:
        notes.append(f"adapter-incomplete: {len(unclassified)} tensor(s) could not be classified; "
                     f"they are counted as read whole and get no search space")
    return Census(path=str(Path(path)), architecture=arch, hyperparameters=hyper, facts=facts,
                  tensors=tensors, formats=formats, unclassified=unclassified, tied_embeddings=tied and embd is not None,
                  notes=notes, file_tensor_bytes=sum(t.bytes for t in tensors if not t.tied))
