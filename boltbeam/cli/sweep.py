"""`boltbeam sweep`: the same decode at several KV depths, a trace each, tokens/s and regions by depth."""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from boltbeam import report
from boltbeam.errors import Refused


def register(sub: argparse._SubParsersAction) -> None:
    from boltbeam.cli.measure import profile_flags
    from boltbeam.cli.read import model_arg
    p = sub.add_parser("sweep", help="the same decode at several KV depths: tokens/s and µs by region at each",
                       description="Profiles the decode at each depth of --contexts, each in a process of its own "
                                   "(any profile flag applies to every depth), and writes DIR/trace_N.json for each, "
                                   "DIR/sweep.json (the depths, tokens/s and regions) and DIR/sweep.html (tokens/s "
                                   "against depth, with --compare's sweeps beside it).")
    model_arg(p)
    p.add_argument("--contexts", required=True, metavar="N,N,...", help="KV depths, e.g. 512,4096,16384")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the traces, sweep.json and sweep.html")
    p.add_argument("--compare", action="append", default=[], metavar="SWEEP.json",
                   help="another sweep's sweep.json (another engine or route) drawn beside this one (repeatable)")
    p.add_argument("--json", action="store_true", help="print the sweep as JSON")
    before = len(p._actions)
    profile_flags(p, device_required=True, depth=False)
    p.set_defaults(func=run_sweep, profile_actions=p._actions[before:],
                   out_files=lambda a: ["sweep.json", "sweep.html"])      # (and a trace a depth, checked as written)


def passed_on(args: argparse.Namespace) -> list[str]:
    """The profile flags given, as `boltbeam profile` takes them, for every depth's run (the device aside)."""
    argv = []
    for action in args.profile_actions:
        value = getattr(args, action.dest)
        if action.dest == "device" or value == action.default:
            continue
        argv += [action.option_strings[0]] + ([] if value is True else [str(value)])
    return argv


def run_sweep(args: argparse.Namespace) -> int:
    from boltbeam.cli.depth import check_depth
    from boltbeam.cli.read import resolve_model
    from boltbeam.files import output_dir, write_all, json_text
    from boltbeam.account import sweep as sweeps
    from boltbeam.read.census import take_census
    from boltbeam.report.page import render_sweep
    model = resolve_model(args)
    contexts = sweeps.parse_contexts(args.contexts)
    census = take_census(model)
    for context in contexts:
        check_depth(census, context, args.tokens + args.warmup)
    if args.engine == "tinygrad":     # the route and the families as every depth's profile reads them: one line now
        from boltbeam.cli.measure import family_flags
        from boltbeam.route.use import families, route_for
        families(route_for(args.route, model, hash_check=not args.no_hash), family_flags(args))
    others = [(path, sweeps.load(path)) for path in args.compare]     # read before minutes of profiling
    out = output_dir(args.out)
    started = time.monotonic()
    # The traces go to a scratch folder first: the sweep's files land together, or none of them.
    with tempfile.TemporaryDirectory(prefix=".sweep-", dir=out.parent if out.parent.is_dir() else None) as scratch, \
            report.console().status("") as status:
        done = sweeps.sweep(model, args.device, contexts, Path(scratch), passed_on(args),
                            progress=lambda c: status.update(f"profiling at depth {c:,} ({time.monotonic() - started:,.0f} s)"))
        traces = {out / Path(d.trace).name: Path(d.trace).read_bytes() for d in done.depths}
        done = dataclasses.replace(done, depths=[dataclasses.replace(d, trace=str(out / Path(d.trace).name))
                                                 for d in done.depths])
        name = f"{done.engine} on {done.device}" + (f", {Path(args.route).name}" if args.route else "")
        write_all({**traces, out / "sweep.json": json_text(done.to_dict()),
                   out / "sweep.html": render_sweep([(name, done), *others])})
    refused = [f"depth {d.context:,}: {d.refusal}" for d in done.depths if d.refusal]
    if args.json:
        report.print_json(done.to_dict())
    else:
        _print(done, model, name, out)
    if refused:       # as profile alone: the numbers are written, and the run is refused
        raise Refused("; ".join(refused))
    return 0


def _print(done, model: str, name: str, out: Path) -> None:
    from boltbeam.account.compare import REGIONS
    placed = [d for d in done.depths if d.regions_us]
    report.console().print(report.table(
        f"{model} at each depth ({name})", ["depth", "tokens/s", "µs a token", *(r for r in REGIONS if placed), "what ran"],
        [(f"{d.context:,}", f"{d.tok_s:,.1f}", f"{d.wall_us:,.2f}",
          *(f"{d.regions_us.get(r, 0):,.2f}" for r in REGIONS if placed), d.route) for d in done.depths],
        right=tuple(range(1, 3 + (len(REGIONS) if placed else 0)))))
    report.console().print(f"wrote {out / 'sweep.json'}, {out / 'sweep.html'} and a trace a depth")
