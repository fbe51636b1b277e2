"""Every tensor of the file read by the decode token, or a refusal: an engine that leaves a tensor of the
model unread computes another model than the file's (tinygrad.llm runs a file whose architecture has
post-norms it does not know, and never reads them), and an audit of the wrong computation is worse than none.

The census lists every tensor; a profile's kernels name the tensors they read (the tinygrad adapter maps
each kernel's buffers to the file's tensors by the offsets of their views, and a generated route family's
new buffers to the tensors they hold). A tensor some measured token did not read makes the trace
adapter-incomplete, unless a fact about the tensor says reading it changes nothing:

  - a tied output (no output tensor) is the embedding table read whole under the embedding's name, and
    the embedding lookup reads a row of the same table: one name, read by either kernel;
  - a tensor of a role in NEUTRAL whose every value is that role's neutral value (a rotary frequency-factor
    table of ones divides no frequency) leaves the computation as it is without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from boltbeam.measure.trace import Trace
from boltbeam.read.census import Census, TensorEntry

# Engines whose profile names, for each kernel, the file's tensors it read (by the offsets of its buffers).
MAPS_TENSORS = ("tinygrad",)

# role -> (the value that makes each element of a tensor of that role change nothing, the fact, said)
NEUTRAL: dict[str, tuple[float, str]] = {
    "rope_freqs": (1.0, "a rotary frequency-factor table of ones divides no frequency"),
}
# The formats whose values are read directly as numbers (a neutral table is checked value by value).
PLAIN = {"F32": np.float32, "F16": np.float16}

SHOWN = 5     # unread tensors a message names before it counts the rest


@dataclass(frozen=True)
class Unread:
    """The census's tensors against what a profile's kernels read."""
    tensors: int                                           # distinct tensors in the census
    missing: list[str]                                     # tensors a measured token should have read and did not
    excused: dict[str, str] = field(default_factory=dict)  # tensor -> the fact that lets it go unread

    @property
    def complete(self) -> bool:
        return not self.missing

    def sentence(self) -> str:
        """One line: every tensor read, or which were not."""
        if self.complete:
            return (f"every one of the file's {self.tensors} tensors was read by each measured token"
                    + (f" ({len(self.excused)} unread by a fact: " + "; ".join(f"{n}: {why}" for n, why in
                                                                               self.excused.items()) + ")"
                       if self.excused else ""))
        shown = ", ".join(self.missing[:SHOWN]) + (f" and {len(self.missing) - SHOWN} more"
                                                   if len(self.missing) > SHOWN else "")
        return (f"adapter-incomplete: {len(self.missing)} of the file's {self.tensors} tensors were never read by a "
                f"measured token ({shown}): nothing shows the engine computed the file's model")

    def to_dict(self) -> dict:
        return {"status": "complete" if self.complete else "adapter-incomplete", "tensors": self.tensors,
                "missing": self.missing, "excused": self.excused}


def unread_tensors(trace: Trace, census: Census) -> Unread | None:
    """The census's tensors some measured token of `trace` did not read, less those a fact excuses; None where
    the trace cannot say (an engine whose kernels name no tensors, or no kernel recorded)."""
    tokens = trace.by_token()
    if trace.environment.engine not in MAPS_TENSORS or trace.provenance.source != "profile" or not tokens:
        return None
    read_by_all = set.intersection(*({n for k in ks for n in k.tensors} for ks in tokens.values()))
    entries = {t.name: t for t in census.tensors if not t.tied}    # a tied output is the embedding's name
    missing, excused = [], {}
    for name, t in entries.items():
        if name in read_by_all:
            continue
        if (fact := _neutral(census.path, t)) is not None:
            excused[name] = fact
        else:
            missing.append(name)
    return Unread(len(entries), missing, excused)


def _neutral(path: str, t: TensorEntry) -> str | None:
    """The fact that makes this tensor change nothing (its role's neutral value in every element), or None."""
    if t.role not in NEUTRAL or PLAIN.get(t.format) is None:
        return None
    value, fact = NEUTRAL[t.role]
    data = np.memmap(path, dtype=PLAIN[t.format], mode="r", offset=t.data_offset, shape=(t.elements,))
    return fact if bool(np.all(data == value)) else None
