"""Model shapes for synthetic files: the presets in presets.toml and a shape from one with overrides.
Apart from the writer so the CLI can list the presets without loading numpy and gguf."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources

from boltbeam.errors import BadInput


@dataclass(frozen=True)
class Shape:
    blocks: int
    embedding: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocabulary: int
    context_length: int = 4096


def presets() -> dict[str, Shape]:
    data = tomllib.loads(resources.files("boltbeam.synth").joinpath("presets.toml").read_text())
    return {name: Shape(**body) for name, body in data.items()}


def shape_from(preset: str | None, **overrides: int | None) -> Shape:
    table = presets()
    if preset is not None and preset not in table:
        raise BadInput(f"unknown preset {preset!r}; known: {', '.join(table)}")
    base = vars(table[preset]).copy() if preset else {}
    base.update({k: v for k, v in overrides.items() if v is not None})
    missing = [f.name for f in fields(Shape) if f.name not in base and f.default is f.default_factory]
    if missing:
        raise BadInput(f"synth needs --preset or all of: {', '.join(missing)}")
    shape = Shape(**base)
    if any(v <= 0 for v in vars(shape).values()):
        raise BadInput("every dimension must be positive")
    if shape.heads % shape.kv_heads:
        raise BadInput("heads must be a multiple of kv_heads")
    return shape
