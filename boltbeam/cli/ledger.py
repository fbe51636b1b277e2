"""`boltbeam ledger add|list|show|why|verify|export`: the append-only record of verdicts."""
from __future__ import annotations

import argparse
import getpass
import socket
import sys
from dataclasses import asdict
from pathlib import Path

from rich.markup import escape

from boltbeam.errors import BadInput, Refused
from boltbeam.files import write_atomic
from boltbeam.judge.verdicts import VERDICTS
from boltbeam.ledger.store import DEFAULT_PATH, Entry, Ledger, Verification, draft, to_jsonl
from boltbeam.report import console, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    ledger = sub.add_parser("ledger", help="the append-only record of verdicts: have we been here before?")
    cmds = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--ledger", type=Path, default=DEFAULT_PATH, metavar="PATH",
                       help=f"the ledger file (default {DEFAULT_PATH})")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for machines")

    p = cmds.add_parser("add", parents=[where, as_json], help="record a verdict by hand")
    p.add_argument("--candidate", required=True, metavar="ID")
    p.add_argument("--verdict", required=True, choices=VERDICTS, metavar="VERDICT", help=", ".join(VERDICTS))
    p.add_argument("--reason", required=True, action="append", metavar="TEXT", help="a sentence saying why (repeatable)")
    p.add_argument("--evidence", nargs="+", action="extend", default=[], metavar="FILE",
                   help="traces and records it rests on (hashed into the entry)")
    p.add_argument("--reopen", metavar="TEXT",
                   help="when it may be tried again: key=value / key!=value clauses joined by ';', or free text "
                        "(required for refute and search-space-incomplete)")
    p.add_argument("--scope", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="what it was judged on, e.g. setting=UPCAST:4 kernel_kind=matvec target=h200 (repeatable)")
    p.add_argument("--actor", help="who or what ran it (default: you@host, by hand)")
    p.set_defaults(func=_add)

    p = cmds.add_parser("list", parents=[where, as_json], help="the entries, oldest first")
    p.add_argument("--candidate", metavar="ID")
    p.add_argument("--verdict", choices=VERDICTS, metavar="VERDICT", help=", ".join(VERDICTS))
    p.set_defaults(func=_list)

    p = cmds.add_parser("show", parents=[where, as_json], help="one entry, whole")
    p.add_argument("id", type=int, metavar="N")
    p.set_defaults(func=_show)

    p = cmds.add_parser("why", parents=[where, as_json], help="a candidate's story: every entry, oldest first")
    p.add_argument("candidate", metavar="CANDIDATE")
    p.set_defaults(func=_why)

    p = cmds.add_parser("verify", parents=[where, as_json], help="check the hash chain; name the first bad entry (exit 3)")
    p.set_defaults(func=_verify)

    p = cmds.add_parser("export", parents=[where], help="JSON Lines for review in a pull request")
    p.add_argument("--out", type=Path, metavar="FILE", help="write here (atomically) instead of stdout")
    p.set_defaults(func=_export)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} (boltbeam ledger add)"


def _scope(pairs: list[str]) -> dict[str, str]:
    scope = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise BadInput(f"--scope {pair!r}: expected KEY=VALUE")
        scope[key.strip()] = value.strip()
    return scope


def _add(args: argparse.Namespace) -> int:
    # Check everything (and hash the evidence) before the ledger is opened: bad input writes nothing.
    d = draft(candidate=args.candidate, verdict=args.verdict, reasons=args.reason, scope=_scope(args.scope),
              evidence=args.evidence, reopen=args.reopen, actor=args.actor or _who())
    with Ledger(args.ledger) as ledger:
        entry = ledger.entry(ledger.record(d))
    if args.json:
        print_json(entry.to_dict())
    else:
        console().print(f"recorded entry #{entry.id} in {escape(str(args.ledger))}: "
                        f"{escape(entry.candidate)} {entry.verdict}")
    return 0


def _list(args: argparse.Namespace) -> int:
    with Ledger(args.ledger, create=False) as ledger:
        entries = ledger.entries(candidate=args.candidate, verdict=args.verdict)
    if args.json:
        print_json([e.to_dict() for e in entries])
        return 0
    rows = [(e.id, e.time, e.candidate, e.verdict, " ".join(e.reasons), e.reopen) for e in entries]
    console().print(table(escape(f"{args.ledger}: {len(entries)} entries"),
                          ["#", "time", "candidate", "verdict", "reasons", "reopen when"], rows, right=[0]))
    return 0


def _show(args: argparse.Namespace) -> int:
    with Ledger(args.ledger, create=False) as ledger:
        e = ledger.entry(args.id)
    if args.json:
        print_json(e.to_dict())
        return 0
    rows = [("candidate", e.candidate), ("verdict", e.verdict), ("time", e.time), ("actor", e.actor),
            ("reasons", "\n".join(e.reasons)),
            ("scope", "\n".join(f"{k} = {v}" for k, v in e.scope.items())),
            ("evidence", "\n".join(f"{f['path']}  sha256 {f['sha256']}" for f in e.evidence)),
            ("reopen when", e.reopen), ("previous hash", e.prev_hash), ("hash", e.hash)]
    console().print(table(f"ledger entry #{e.id}", ["field", "value"], rows))
    return 0


def _standing(latest: Entry) -> str:
    if latest.blocks:
        return f"{latest.verdict} (entry #{latest.id}); the search skips it until: {escape(latest.reopen or '')}"
    return f"{latest.verdict} (entry #{latest.id}) is the latest word"


def _why(args: argparse.Namespace) -> int:
    with Ledger(args.ledger, create=False) as ledger:
        history = ledger.entries(candidate=args.candidate)
    if args.json:
        print_json({"candidate": args.candidate, "entries": [e.to_dict() for e in history]})
        return 0
    out = console()
    if not history:
        out.print(f"{escape(args.candidate)}: no entries in {escape(str(args.ledger))}; never judged.")
        return 0
    out.print(f"[bold]{escape(args.candidate)}[/]: {_standing(history[-1])}")
    for e in history:
        out.print(f"\n#{e.id}  {e.time}  [bold]{e.verdict}[/]  by {escape(e.actor)}")
        for reason in e.reasons:
            out.print(f"  - {escape(reason)}")
        if e.scope:
            out.print("  scope: " + escape(", ".join(f"{k}={v}" for k, v in e.scope.items())))
        for f in e.evidence:
            out.print(f"  evidence: {escape(f['path'])} (sha256 {f['sha256'][:12]})")
        if e.reopen:
            out.print(f"  reopen when: {escape(e.reopen)}")
    return 0


def _refuse_if_broken(path: Path, result: Verification) -> None:
    if not result.ok:
        intact = f"; the {result.entries} entries before it are intact" if result.bad_entry else ""
        raise Refused(f"ledger {path}: {result.problem}{intact}")


def _verify(args: argparse.Namespace) -> int:
    with Ledger(args.ledger, create=False) as ledger:
        result = ledger.verify()
    if args.json:
        print_json(asdict(result) | {"ok": result.ok})
    _refuse_if_broken(args.ledger, result)
    if not args.json:
        console().print(f"{escape(str(args.ledger))}: {result.entries} entries, chain intact; head {result.head}")
    return 0


def _export(args: argparse.Namespace) -> int:
    with Ledger(args.ledger, create=False) as ledger:
        _refuse_if_broken(args.ledger, ledger.verify())   # a reviewer must be able to trust what they read
        entries = ledger.entries()
    text = to_jsonl(entries)
    if args.out is None:
        sys.stdout.write(text)
    else:
        write_atomic(args.out, text)
        console().print(f"wrote {len(entries)} entries to {escape(str(args.out))}")
    return 0
