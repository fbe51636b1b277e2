"""Constants once: a tensor that reads nothing is computed once, not inside every replay of the JIT.

tinygrad keeps tensors lazy until realized, so a table built from aranges and sines (a rotary
position table, say) becomes kernels inside the decode JIT, recomputed every token though it reads
no input and writes the same bytes each time. This family finds such tensors by that fact alone
(a graph with no buffer and no variable in it), never by name, and realizes them before the decode
JIT captures. A block makes its state on its first call, so the family runs right after the
block's own `_init_state` (tinygrad.llm's hook for that).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from boltbeam.measure.prepared import Prepared
from boltbeam.route.family import Family, Replaces, Switch, after_init_state, switch
from boltbeam.foresight.future import Foreseen

LABEL = "constants-once"           # what it adds to a trace's route label
SPACE = "constants_once"           # its one knob: data/spaces.toml


@dataclass(frozen=True)
class Once(Switch):
    """The family's setting, as the search judges it (profile --constants-once; the route's constants_once)."""
    SPACE: ClassVar[str] = SPACE
    once: int = 1


def is_constant(t) -> bool:
    """An unrealized tensor whose graph reads no buffer and no variable: the same bytes every time."""
    from tinygrad.uop.ops import Ops
    if t.uop.base.is_realized:
        return False
    return not any(u.op in (Ops.BUFFER, Ops.BUFFER_VIEW, Ops.DEFINE_VAR, Ops.BIND) for u in t.uop.toposort())


def realize_constants(obj, prepared: Prepared) -> None:
    """Realize every constant tensor attribute of `obj` in place, and count it."""
    from tinygrad import Tensor
    for value in vars(obj).values():
        if isinstance(value, Tensor) and is_constant(value):
            t0 = time.perf_counter()
            value.realize()
            prepared.applied += 1
            prepared.eligible += 1
            prepared.bytes += value.nbytes()
            prepared.seconds += time.perf_counter() - t0


def install(net, census=None, model_path: str | None = None, setting: Once | None = None) -> Prepared:
    """Wrap each block's state initialisation so the constants it makes are realized at once."""
    prepared = Prepared(LABEL, {})
    realize_constants(net, prepared)
    after_init_state(net, lambda block: realize_constants(block, prepared))
    return prepared


def foresee(census, once: Once, context: int, target, cal, on=None) -> Foreseen:
    """Tensors that read nothing, computed once at load: a token then moves none of their bytes and launches
    none of their kernels."""
    return Foreseen(0, 0, 0.0, ("computed once at load",))


FAMILY = Family(SPACE, LABEL, "constants_once", install=install, read=switch(Once),
                of_values=lambda values: Once(**values), foresee=foresee, replaces=Replaces(categories=("constant",)),
                help="compute once the tensors that read nothing (e.g. a rotary table), instead of inside every "
                     "decode token (also on when the route says so)")
