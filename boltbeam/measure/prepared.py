"""What a generated route family did to the loaded model: the record each family's installer returns
(boltbeam/route/) and the tinygrad adapter reads (its trace's route label and settings, and which GGUF
tensors a new buffer holds, so its kernels keep their roles)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from boltbeam.read.census import TensorEntry


@dataclass
class Prepared:
    """What one generated route family did to the loaded model before its tokens were measured."""
    family: str
    settings: dict[str, Any]
    applied: int = 0                   # parts of the model it changed (layers, tensors)
    eligible: int = 0                  # parts it could have changed
    bytes: int = 0                     # bytes the changed parts now hold
    seconds: float = 0.0               # time spent making the change
    placed: dict[int, tuple[TensorEntry, ...]] = field(default_factory=dict)   # a new buffer's identity -> the GGUF tensors it holds
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {**self.settings, "applied": self.applied, "eligible": self.eligible, "bytes": self.bytes,
                "build_seconds": round(self.seconds, 3)}
