"""`boltbeam account` (the tie-out of one token) and `boltbeam compare` (two traces region by region)."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from boltbeam.errors import BadInput, Refused
from boltbeam.measure.trace import Trace
from boltbeam.report import console, print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("account", help="tie one decode token out: every µs to a cause, lines adding up to the wall",
                       description="The tie-out of one token (means over the trace's measured tokens, each timed token paired with "
                                   "its plain one and the quarter of pairs that differ most either way left out): "
                                   "floor, each weight role's gap above its floor with its cause, kernels that move "
                                   "no weights, gaps and overlap from the device timeline, launch and sync from the "
                                   "target's measured fact; the residual is reported, and an account that does not "
                                   "close is refused (exit 3) naming the measurement that disagrees.")
    p.add_argument("trace", metavar="TRACE.json")
    _model_flags(p)
    p.add_argument("--target", help="a target name (see `boltbeam targets`; default: the one whose device_name the "
                                    "trace recorded, or host for a CPU trace taken here)")
    p.add_argument("--no-hash-check", action="store_true",
                   help="skip checking the trace's model_sha256 against the model file")
    p.add_argument("--load-bytes", type=int, default=16, metavar="B",
                   help="bytes one thread has in flight per request, for Little's law (default 16: a wide load)")
    p.add_argument("--price-per-hour", type=float, metavar="USD",
                   help="the device's price per hour for the what-ifs (default: the target's price_per_hour fact)")
    p.add_argument("--json", action="store_true", help="print the account as JSON")
    p.set_defaults(func=run_account)

    p = sub.add_parser("compare", help="two traces of one model, region by region: who wins where, by how much",
                       description="Region by region in µs per token (per-token medians), the winner of each, the "
                                   "net, and each region's distance from its floor (with --model or --target).")
    p.add_argument("trace_a", metavar="TRACE_A.json")
    p.add_argument("trace_b", metavar="TRACE_B.json")
    _model_flags(p)
    p.add_argument("--target", help="a target name, for floors (with --model or alone: the model is then "
                                    "found as account finds it; --model alone finds the target so)")
    p.add_argument("--exclusive", action="store_true",
                   help="count each µs of a token's device time once: where kernels overlap, the time goes to the "
                        "kernel that started first (no overlap row); for an engine whose kernels start before their "
                        "predecessors end")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=run_compare)


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="MODEL.gguf",
                   help="the model the trace ran (account's default: the trace's model_path when that file "
                        "exists, else the embedded SmolLM2-135M Q4_1 model)")
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")


def _bound_for(model: str, args: argparse.Namespace, trace: Trace):
    from boltbeam.bound.roofline import bound
    from boltbeam.bound.targets import get_target, target_of
    from boltbeam.read.census import take_census
    env = trace.environment
    target = (get_target(args.target, args.targets) if args.target
              else target_of(env.device_name, env.device, env.host, args.targets))
    context = trace.workload.context or 0
    return bound(take_census(model), target, context=context, batch=1), target


def check_model(trace: Trace, model: str) -> None:
    """Refuse when the trace says it ran a different file (both hashes known)."""
    from boltbeam.files import sha256_file
    expected = trace.environment.model_sha256
    if expected and (actual := sha256_file(model)) != expected:
        raise Refused(f"the trace ran a different model: its model_sha256 is {expected[:16]}…, "
                      f"{model} hashes to {actual[:16]}… (--no-hash-check to account anyway)")


def model_of(trace: Trace) -> str:
    """The model file a trace ran, when --model is not given: its recorded path if that file is here,
    else the embedded default if the trace's hash says it ran that; never a guess."""
    from boltbeam.cli.read import default_model
    from boltbeam.files import sha256_file
    path, sha = trace.environment.model_path, trace.environment.model_sha256
    if path and Path(path).is_file():
        return path
    try:
        default = default_model()
    except BadInput:
        default = None
    if sha and default and sha256_file(default) == sha:
        return default
    raise BadInput(f"the trace's model ({path or 'no path recorded'}) is not here: pass --model MODEL.gguf")


def run_account(args: argparse.Namespace) -> int:
    from boltbeam.account.price import price_of, returns
    from boltbeam.account.tieout import account
    from boltbeam.measure import trace as tracefile
    if args.load_bytes < 1:
        raise BadInput("--load-bytes must be >= 1")
    trace = tracefile.load(args.trace)
    model = args.model or model_of(trace)
    b, target = _bound_for(model, args, trace)
    if not args.no_hash_check:
        check_model(trace, model)
    acc = account(trace, b, target, load_bytes=args.load_bytes)
    ret = returns(acc, price_of(target, args.price_per_hour))
    if args.json:
        print_json({"trace": args.trace, "model": model, **acc.to_dict(), "returns": ret.to_dict()})
    else:
        _print_account(acc, ret, args.trace, model)
    if acc.refusals:
        raise Refused("; ".join(acc.refusals))
    return 0


def _rate(r, priced: bool) -> str:
    return f"{r.tok_s:,.1f} tok/s" + (f", ${r.usd_per_mtok:,.3f}/Mtok" if priced else "")


def _print_account(acc, ret, trace_path: str, model: str) -> None:
    c = console()
    priced = ret.price is not None
    whatif = {w.label: _rate(w.at_floor, priced) for w in ret.whatifs}
    rows = [(line.label, f"{line.us:,.2f}", f"{line.us / acc.wall_us:.1%}", line.cause, whatif.get(line.label, ""),
             line.detail) for line in acc.lines]
    rows.append(("residual", f"{acc.residual_us:,.2f}", f"{acc.residual_us / acc.wall_us:.1%}",
                 "closed" if acc.closed else "NOT CLOSED", "", "the wall minus every line above: computed, never a plug"))
    rows.append(("wall", f"{acc.wall_us:,.2f}", "100.0%", "", _rate(ret.measured, priced),
                 "the plain token: the route as users run it, nothing recording"))
    c.print(table(f"Tie-out of one token of {escape(trace_path)} on {acc.target}, context {acc.context} "
                  f"({acc.method}, {acc.tokens_used} token(s)); roles biggest gap first",
                  ["line", "µs", "of wall", "cause", "if at its floor", "detail"], rows, right=(1, 2)))
    c.print(f"model {escape(model)}; floor {acc.floor_us:,.2f} µs = {acc.floor_us / acc.wall_us:.1%} of the "
            f"{acc.wall_us:,.2f} µs token; kernels sum to {acc.kernel_sum_us:,.2f} µs")
    c.print(f"measured {_rate(ret.measured, priced)}; at the ceiling {_rate(ret.ceiling, priced)}; "
            + (f"price {ret.price.usd_per_hour:,.2f} USD/h ({escape(ret.price.source)})" if priced
               else "no price (the target has no price_per_hour fact; --price-per-hour sets one)"))
    if acc.kernel_pass_wall_us is not None:
        checks = [f"timed tokens {acc.kernel_pass_wall_us:,.2f} µs ({acc.kernel_pass_wall_us / acc.wall_us - 1:+.2%} "
                  f"against plain: what timing the kernels cost)"]
        if acc.lead_us is not None and acc.trail_us is not None:
            checks.append(f"before the first kernel {acc.lead_us:,.2f} µs, after the last {acc.trail_us:,.2f} µs")
        if acc.launch_wall_us is not None:
            checks.append(f"tokens timed per launch {acc.launch_wall_us:,.2f} µs "
                          f"({acc.launch_wall_us / acc.wall_us - 1:+.2%} against plain)")
        if acc.timing_cost_per_kernel_us is not None:
            checks.append(f"the timing's cost {acc.timing_cost_us:,.2f} µs a token, "
                          f"{acc.timing_cost_per_kernel_us:.3g} µs a kernel over {acc.kernels_per_token:,.0f}")
        if acc.plain_outside_us is not None:
            checks.append(f"plain tokens outside their brackets {acc.plain_outside_us:,.2f} µs, the lines count "
                          f"{acc.counted_outside_us:,.2f} µs")
        c.print(f"checks, not lines ({escape(acc.timing or 'timing not recorded')}): " + "; ".join(checks))
    for note in acc.notes:
        c.print(f"note: {escape(note)}")


def run_compare(args: argparse.Namespace) -> int:
    from boltbeam.account.compare import compare
    from boltbeam.measure import trace as tracefile
    a, b = tracefile.load(args.trace_a), tracefile.load(args.trace_b)
    # Floors where either is given; the other is found as `account` finds it.
    bound = _bound_for(args.model or model_of(a), args, a)[0] if args.model or args.target else None
    cmp = compare(a, b, bound, exclusive=args.exclusive)
    if args.json:
        print_json({"trace_a": args.trace_a, "trace_b": args.trace_b, **cmp.to_dict()})
        return 0
    _print_compare(cmp, args.trace_a, args.trace_b)
    return 0


def _num(x: float | None, signed: bool = False) -> str:
    return "" if x is None else f"{x:+,.2f}" if signed else f"{x:,.2f}"


def _print_compare(cmp, path_a: str, path_b: str) -> None:
    c = console()
    c.print(f"A: {escape(path_a)} ({escape(cmp.a_label)})\nB: {escape(path_b)} ({escape(cmp.b_label)})")
    rows = [(r.region, _num(r.a_us), _num(r.b_us), _num(r.diff_us, True),
             "" if r.winner is None else r.winner if r.winner == "tie"
             else f"{r.winner} by {abs(r.diff_us):,.2f} µs" + (f" ({abs(r.diff_us) / most:.0%})"
                                                               if (most := max(abs(r.a_us), abs(r.b_us))) else ""),
             _num(r.floor_us), _num(r.a_gap_us), _num(r.b_gap_us)) for r in cmp.regions]
    c.print(table("Regions, µs per token (median per token" + (", each µs of device time once)" if cmp.exclusive else ")"),
                  ["region", "A µs", "B µs", "B - A", "winner", "floor µs", "A above floor", "B above floor"],
                  rows, right=(1, 2, 3, 5, 6, 7)))
    d = cmp.to_dict()
    c.print(f"whole token: A {cmp.a_wall_us:,.2f} µs, B {cmp.b_wall_us:,.2f} µs; net B - A {cmp.net_us:+,.2f} µs "
            f"({'tie' if d['winner'] == 'tie' else d['winner'] + ' wins'})")
    if cmp.region_net_us is not None:
        c.print(f"the rows sum to {cmp.region_net_us:+,.2f} µs of it; {d['outside_kernels_us']:+,.2f} µs lies outside "
                f"the compared rows (launch and sync, incomparable rows)")
    if not cmp.floors_shown:
        c.print("floors are not shown: pass --model and --target")
    by_reason: dict[str, list[str]] = {}
    for item in cmp.incomparable:
        by_reason.setdefault(item["reason"], []).append(item["region"])
    for reason, regions in by_reason.items():
        c.print(f"cannot compare {', '.join(regions)}: {escape(reason)}")
    for note in cmp.notes:
        c.print(f"note: {escape(note)}")
