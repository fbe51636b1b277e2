"""`boltbeam judge`: did the change help? Reads two traces and a checks file, prints the verdict."""
from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from rich.markup import escape

from boltbeam.errors import Refused
from boltbeam.judge.verdicts import VERDICTS
from boltbeam.measure import trace
from boltbeam.report import console, print_json, table

if TYPE_CHECKING:
    from boltbeam.judge.judge import Judgement


def _positive_us(text: str) -> float:
    from boltbeam.units import real
    try:
        value = real(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of µs, not {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("judge", help="did the change help? one of eight verdicts from A/B whole-token samples",
                       description="Judge candidate trace B against baseline trace A: promote only when the "
                                   "output is still correct, the intended route ran, the whole token is faster "
                                   "beyond noise, memory fits and one switch turns it off. Given a trace a process, "
                                   "more than one a side: every pair judged, a verdict only where all agree.")
    p.add_argument("--baseline", required=True, action="append", metavar="A.json",
                   help="the baseline trace (again for each process that measured it)")
    p.add_argument("--candidate", required=True, action="append", metavar="B.json",
                   help="the candidate trace (again for each process that measured it)")
    p.add_argument("--checks", metavar="CHECKS.json", help="what the candidate is held to (keys: see boltbeam.judge.judge)")
    p.add_argument("--floor-us", type=_positive_us, metavar="US",
                   help="physics floor of one token in µs (overrides the checks file's token_floor_us)")
    p.add_argument("--reference", metavar="REF.json", help="a reference engine's trace of the same model and prompt "
                   "(`profile --engine llama.cpp`): the candidate's greedy tokens must equal its output tokens over the "
                   "steps both decoded (overrides the checks file's reference_tokens); without one the output is held "
                   "to the baseline's only, and the verdict says so")
    p.add_argument("--ledger", metavar="PATH", help="record the verdict in this ledger")
    p.add_argument("--actor", default="boltbeam judge", help="who records the verdict (default: %(default)s)")
    p.add_argument("--expect", choices=VERDICTS, metavar="VERDICT",
                   help="refuse (exit 3) unless the verdict is this one; for scripts")
    p.add_argument("--json", action="store_true", help="print the judgement as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from boltbeam.judge.judge import (MEASUREMENT_ERROR, Checks, judge_processes, load_checks,  # scipy: only when judging
                                      with_reference)
    baselines, candidates = [trace.load(p) for p in args.baseline], [trace.load(p) for p in args.candidate]
    checks = load_checks(args.checks) if args.checks else Checks()
    if args.floor_us is not None:
        checks = dataclasses.replace(checks, token_floor_us=args.floor_us)
    if args.reference:
        checks = with_reference(checks, trace.load(args.reference), candidates, args.reference)
    judgement = judge_processes(baselines, candidates, checks)
    entry = _record(judgement, args) if args.ledger else None
    if args.json:
        print_json({**judgement.to_dict(), "ledger_entry": entry})
    else:
        _print(judgement, entry, args.ledger)
    if judgement.measurement_error:
        raise Refused(next(r for r in judgement.reasons if r.startswith(MEASUREMENT_ERROR)))
    if args.expect and judgement.verdict != args.expect:
        raise Refused(f"the verdict is {judgement.verdict}, expected {args.expect}")
    return 0


def _record(judgement: Judgement, args: argparse.Namespace) -> int:
    from boltbeam.ledger.store import Ledger  # here, so judging never depends on the ledger

    evidence = [*args.baseline, *args.candidate] + [p for p in (args.checks, args.reference) if p]
    with Ledger(args.ledger) as ledger:
        return ledger.append(candidate=judgement.candidate_id, verdict=judgement.verdict, reasons=judgement.reasons,
                             scope=judgement.scope.as_json(), evidence=evidence, reopen=judgement.reopen,
                             actor=args.actor)


def _print(judgement: Judgement, entry: int | None, ledger: str | None) -> None:
    out = console()
    out.print(f"[bold]{judgement.verdict}[/bold]  candidate {escape(judgement.candidate_id)}")
    if judgement.gates:
        out.print(table("gates", ("gate", "status", "evidence"),
                        ((name, g.status, g.sentence) for name, g in judgement.gates.items())))
    shown = {g.sentence for g in judgement.gates.values()}
    for reason in judgement.reasons:
        if reason not in shown:
            out.print(f"- {escape(reason)}")
    out.print(f"output checked against {escape(judgement.checked_against)}")
    if judgement.reopen:
        out.print(f"reopen {escape(judgement.reopen)}")
    if entry is not None:
        out.print(f"recorded as entry {entry} in {escape(ledger)}")
