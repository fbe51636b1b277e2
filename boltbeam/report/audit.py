"""The whole audit of one route as one record: what the page draws and what `audit.json` holds.

Built from the steps' own outputs (the census, the bound, the trace, the account, the comparisons,
the ledger); nothing here measures or estimates anything.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Any, Callable

from boltbeam import __version__
from boltbeam.account.compare import Comparison, compare
from boltbeam.account.price import Price, Returns, returns
from boltbeam.account.tieout import Account, account, role_of
from boltbeam.bound.roofline import Bound
from boltbeam.bound.targets import Target
from boltbeam.errors import BadInput, Refused
from boltbeam.files import load_json
from boltbeam.ledger.store import Entry, Ledger
from boltbeam.measure import trace as tracefile
from boltbeam.measure.importers import import_llama_bench
from boltbeam.measure.trace import Kernel, Trace
from boltbeam.measure.unread import Unread, unread_tensors
from boltbeam.read.census import take_census
from boltbeam.report.chrome import kernel_offsets_us


@dataclass
class Compared:
    path: str
    comparison: Comparison


@dataclass(frozen=True)
class Funnel:
    """A search's space, step by step (from `boltbeam search`'s search.json)."""
    path: str
    settings: int       # every setting of the family, over the token's distinct kernels
    legal: int          # after BubbleBeam
    survivors: int      # after FutureSight
    timed: int          # timed now or read from the ledger
    chosen: int         # settings in the route
    rejected_by_reason: dict[str, int]

    @property
    def steps(self) -> list[tuple[str, int]]:
        return [("settings", self.settings), ("legal (BubbleBeam)", self.legal),
                ("survived FutureSight", self.survivors), ("timed", self.timed), ("in the route", self.chosen)]


def load_funnel(path: str) -> Funnel:
    """A search's funnel from its search.json (checked field by field: a file that is not one is one line)."""
    from boltbeam.search.summary import SearchSummary
    s = SearchSummary.load(path)
    sp = s.space
    return Funnel(path, sp.settings, sp.legal, sp.survivors, s.timed_now + s.reused_from_ledger, s.routed_kernels,
                  sp.rejected_by_reason)


@dataclass(frozen=True)
class OutputCheck:
    """The route's greedy tokens held to a reference engine's: a compared trace of another engine that decoded
    the same model from the same prompt ids."""
    engine: str
    path: str
    status: str       # the judge's gate status: pass, fail or no-evidence
    sentence: str


def output_check(trace: Trace, others: list[tuple[str, Trace]]) -> OutputCheck | None:
    """The first compared trace that can serve as a reference for `trace`'s output, held to; None without one."""
    others = [(path, other) for path, other in others if other.environment.engine != trace.environment.engine]
    if not others:
        return None
    from boltbeam.judge.judge import Checks, reference_gate, with_reference   # (scipy: only with another engine's trace)
    for path, other in others:
        try:
            checks = with_reference(Checks(), other, [trace], path)
        except BadInput:          # no tokens, or another model or prompt: no reference
            continue
        gate = reference_gate(trace, checks.reference_engine, checks.reference_tokens, 0.0)
        return OutputCheck(checks.reference_engine, path, gate.status, gate.sentence)
    return None


@dataclass
class Audit:
    model: str
    trace_path: str
    trace: Trace
    target: Target
    bound: Bound
    account: Account | None
    no_account: str | None        # why there is no account (a whole-token trace), else None
    returns: Returns | None
    compared: list[Compared] = field(default_factory=list)
    ledger_path: str | None = None
    ledger: list[Entry] = field(default_factory=list)
    funnel: Funnel | None = None
    unread: Unread | None = None      # the file's tensors the token did not read (None: the trace cannot say)
    output: OutputCheck | None = None  # its greedy tokens against a reference engine's (None: no reference)

    @property
    def wall_us(self) -> float:
        return median(self.trace.token_wall_us)

    def token_kernels(self) -> tuple[int, list[Kernel], list[float]] | None:
        """The token drawn on the timeline: the one whose kernel sum is the median; its kernels and
        their offsets from the token's start (device starts, or laid end to end without them)."""
        groups = self.trace.by_token()
        if not groups:
            return None
        ranked = sorted(groups, key=lambda t: sum(k.duration_us for k in groups[t]))
        token = ranked[len(ranked) // 2]
        return token, groups[token], kernel_offsets_us(groups[token])

    def to_dict(self) -> dict[str, Any]:
        acc = self.account
        return {"boltbeam": __version__, "model": self.model, "trace": self.trace_path,
                "target": self.target.name, "context": self.bound.context,
                "device": self.trace.environment.device, "route": asdict(self.trace.route),
                "wall_us": self.wall_us, "floor_us": self.bound.token_floor_us,
                "ceiling_tok_s": self.bound.ceiling_tok_s,
                "account": acc.to_dict() if acc else None, "no_account": self.no_account,
                "returns": self.returns.to_dict() if self.returns else None,
                "compared": [{"path": c.path, **c.comparison.to_dict()} for c in self.compared],
                "ledger": self.ledger_path, "ledger_entries": len(self.ledger),
                "search": None if self.funnel is None else {"path": self.funnel.path, **dict(self.funnel.steps)},
                "tensors_read": self.unread.to_dict() if self.unread else None,
                "output_reference": vars(self.output) if self.output else None}


def line_of(acc: Account) -> Callable[[Kernel], str]:
    """The tie-out line a kernel's time is counted in: its role's line (a stacked product's roles share
    one), else its category's."""
    of_role = {r: line.label for line in acc.lines if line.kind == "role" and line.role
               for r in line.stacked or (line.role,)}

    def of(k: Kernel) -> str:
        if role := role_of(k):
            return of_role.get(role, role)
        return "weights (no role)" if k.category == "weights" else k.category   # as the tie-out labels it
    return of


def load_other(path: str, context: int | None) -> Trace:
    """A second side to compare: a BoltBeam trace, or llama-bench JSON (its decode test at `context`)."""
    doc = load_json(path, "trace to compare")
    if isinstance(doc, list):
        return import_llama_bench(path, depth=context)
    return tracefile.from_dict(doc, where=f"trace {path}")


def assemble(trace: Trace, trace_path: str, model: str, target: Target, bound: Bound, price: Price | None,
             others: list[tuple[str, Trace]] = (), ledger: tuple[str, list[Entry]] | None = None,
             funnel: Funnel | None = None, exclusive: bool = False, output: OutputCheck | None = None) -> Audit:
    """The audit of `trace` against its bound; comparisons with each of `others` (path, trace), each µs of
    device time once where `exclusive`, and the ledger's (path, entries), both read with load_other and
    read_ledger before any long step. `output`: its tokens held to a reference decoded for it (else to a
    compared trace of another engine, where one serves)."""
    if not trace.token_wall_us:
        raise BadInput(f"trace {trace_path}: no plain token walls: nothing to audit")
    acc, why = None, None
    try:
        acc = account(trace, bound, target)
    except Refused as e:   # whole-token figures only: the page still draws the rest
        why = str(e)
    compared = [Compared(path, compare(trace, other, bound, exclusive)) for path, other in others]
    ledger_path, entries = ledger or (None, [])
    return Audit(model, trace_path, trace, target, bound, acc, why, returns(acc, price) if acc else None,
                 compared, ledger_path, entries, funnel, unread_tensors(trace, take_census(model)),
                 output or output_check(trace, list(others)))


def read_ledger(path: str) -> tuple[str, list[Entry]]:
    """A ledger's entries, read only (a missing ledger is bad input, never created here)."""
    with Ledger(path, create=False) as ledger:
        return path, ledger.entries()
