"""`boltbeam search`: BubbleBeam lists, FutureSight orders, BoltBeam times the survivors, writes a route,
and judges the whole token with and without it."""
from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.markup import escape

from boltbeam import report, switches
from boltbeam.errors import BadInput, Refused
from boltbeam.route.families import BY_NAME, Flags

OUTPUTS = ("route.json", "search.json", "baseline.json", "candidate.json")
JUDGE_TOKENS = 32    # whole tokens per side for the judge: plain and timed, 64 greedy steps and more compared


def register(sub: argparse._SubParsersAction) -> None:
    from boltbeam.cli.read import model_arg
    p = sub.add_parser("search", help="search kernel settings with reasons: list legal ones (BubbleBeam), order them "
                                      "(FutureSight), time the survivors, write a route and judge the whole token",
                       description="Writes into --out DIR: " + ", ".join(OUTPUTS) + ". Every timing and the verdict "
                                   "go in the ledger; a setting timed before in the same scope is not timed again.")
    model_arg(p)
    p.add_argument("--device", required=True, choices=["CPU", "CUDA"], help="tinygrad device (DEV)")
    p.add_argument("--target", required=True, help="the chip's declared facts (see `boltbeam targets`)")
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")
    p.add_argument("--context", type=int, default=0, metavar="N", help="KV depth the decode token runs at")
    p.add_argument("--family", default="tinygrad_opts", help="the setting family of data/spaces.toml to search "
                   f"(tinygrad_opts: per kernel; {', '.join(BY_NAME)}: generated families, each setting judged "
                   "on the whole token)")
    p.add_argument("--budget", type=int, default=8, metavar="K", help="settings timed per kernel at most (default 8); "
                   "with a whole-token family, settings judged at most, FutureSight's best first")
    p.add_argument("--seconds-per-kernel", type=float, default=30.0, metavar="S",
                   help="no new setting is timed for a kernel after S seconds of its own (default 30)")
    p.add_argument("--ledger", default=".boltbeam/ledger.sqlite", metavar="L", help="the ledger (created if missing)")
    p.add_argument("--tokens", type=int, default=JUDGE_TOKENS, metavar="K",
                   help=f"whole tokens per side for the judge (default {JUDGE_TOKENS})")
    p.add_argument("--layout", metavar="SCALES:FORM[:stacked]", help="search the kernels of the token on the generated layout "
                   "(see `profile --layout`); the route file carries the layout")
    p.add_argument("--constants-once", action="store_true", help="search the token with its constants computed once; "
                   "the route file carries it")
    p.add_argument("--no-judge", action="store_true", help="write the route without profiling the whole token")
    p.add_argument("--beam", type=int, default=0, metavar="N", help="with a whole-token family: every whole token, "
                   "the baseline's too, runs with tinygrad's BEAM search of width N (the route file keeps N)")
    p.add_argument("--on", metavar="ROUTE.json", help="with a whole-token family: add its settings to this route "
                   "(its other families), judged against the route as it is; the new route keeps both")
    p.add_argument("--baseline", metavar="TRACE.json", help="with a whole-token family: judge against this profile "
                   "of the route the settings go on (same model, device, context and --beam) instead of profiling it")
    p.add_argument("--alone", type=int, metavar="K", help="with --family gemv: first time each product of the route's "
                   "layout alone at its K best predicted geometries (at most --seconds-per-kernel S a product), and "
                   "judge the fastest geometry for each product before the family's single geometries")
    p.add_argument("--alone-from", metavar="SEARCH.json", help="with --alone: time first, for each product, the "
                   "geometries an earlier gemv search (its search.json) timed fastest there (up to half of K), "
                   "then FutureSight's best")
    fan = p.add_mutually_exclusive_group()
    fan.add_argument("--workers", type=int, metavar="N", help="time on a local Dask cluster of N worker processes, "
                     "one device each (on CUDA, worker i sees GPU i); planning and the ledger stay here")
    fan.add_argument("--scheduler", metavar="ADDRESS", help="time on an existing Dask cluster (e.g. tcp://host:8786) "
                     "whose workers offer a GPU resource and see the model and --out at these paths")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the route, the summary and the two traces")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    # (a baseline given is read, not profiled into baseline.json)
    p.set_defaults(func=run, out_files=lambda a: [n for n in OUTPUTS if n != "baseline.json" or not a.baseline])

    p = sub.add_parser("search-calibrate", help="fit FutureSight's constants to settings searches have timed",
                       description="Reads searches' summaries and ledgers (pairs: --summary S --ledger L, repeatable), "
                                   "fits the constants that order each kernel's measured settings best (median "
                                   "Spearman within a kernel) on the first pair, checks them on the rest, and prints "
                                   "the entry for boltbeam/data/futuresight.toml. With --layout-trace instead: the "
                                   "fraction of the bandwidth a layout's products reached, by how they are written "
                                   "(the median over the traces of each).")
    p.add_argument("--summary", action="append", default=[], metavar="SEARCH.json")
    p.add_argument("--ledger", action="append", default=[], metavar="LEDGER")
    p.add_argument("--layout-trace", action="append", default=[], metavar="TRACE.json",
                   help="a profile of the whole token on a layout (profile --layout), on this target")
    p.add_argument("--target", required=True)
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run_calibrate)


def _facts_needed(fam, target) -> None:
    """A target declaring none of the facts the family's rules compare against leaves only the empty
    setting: that is a target not described well enough to search on."""
    facts = {r.fact for r in fam.rules}
    if facts and not any(target.fact(f) is not None for f in facts):
        raise BadInput(f"target {target.name} declares none of the facts family {fam.name} needs "
                       f"({', '.join(sorted(facts))}): add them to its targets file")


def run(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from boltbeam.bound.targets import get_target
    from boltbeam.cli.depth import check_depth
    from boltbeam.route.families import installers, settings, stored
    from boltbeam.cli.read import resolve_model
    from boltbeam.files import sha256_file, writable_dir, write_json
    from boltbeam.ledger.store import Ledger
    from boltbeam.measure import route as routes
    from boltbeam.read.census import take_census
    from boltbeam.foresight.space import searchable
    if args.budget < 1 or args.tokens < 5 or args.context < 0 or not args.seconds_per_kernel > 0 \
            or (args.workers is not None and args.workers < 1):
        raise BadInput("need --budget >= 1, --seconds-per-kernel > 0, --tokens >= 5 (the judge's minimum), "
                       "--context >= 0 and --workers >= 1")
    model = resolve_model(args)
    target = get_target(args.target, args.targets)
    if args.family in BY_NAME:
        return _choose_whole(model, target, args)
    if args.beam or args.baseline or args.on or args.alone or args.alone_from:
        raise BadInput(f"--beam, --on, --baseline and --alone (--alone-from) judge whole tokens: they go with --family "
                       f"{' or '.join(BY_NAME)}")
    fam = searchable(args.family)
    _facts_needed(fam, target)
    chosen = settings(None, Flags(layout=args.layout, constants_once=args.constants_once))
    census = take_census(model)   # a missing model or no GGUF: one line, before anything is written
    check_depth(census, args.context, args.tokens)   # before a prompt is built
    started = time.monotonic()
    switches.DEV.set(args.device)   # tinygrad reads its device when first imported
    from boltbeam.search import fanout
    from boltbeam.search.decide import search
    job = fanout.Job(os.path.abspath(model), sha256_file(model), args.device, args.context,
                     tuple(installers(chosen)))
    refused = None
    with contextlib.ExitStack() as stack:
        # A cluster is reached and its workers checked before the ledger is opened: bad configuration
        # leaves it untouched.
        devices = stack.enter_context(fanout.cluster(args.device, args.workers, args.scheduler)) \
            if args.workers is not None or args.scheduler is not None else None
        ledger = stack.enter_context(Ledger(args.ledger))   # a file that is no ledger is refused before anything is written
        out = writable_dir(args.out)
        bar = stack.enter_context(Progress(SpinnerColumn(), "[progress.description]{task.description}",
                                           TimeElapsedColumn(), console=report.console(), transient=True))
        task = bar.add_task("capturing the decode token's kernels", total=None)
        say = lambda what: bar.update(task, description=escape(what))
        if devices is None:
            from boltbeam.search.compiler import capture
            from boltbeam.search.decide import in_process
            captured = capture(model, census, args.device, args.context, say, list(job.prepare))
            time_all = in_process(captured)
            profiles = lambda runs: fanout.profile_pair(model, args.device, runs)
        else:
            say(f"capturing the decode token on a Dask worker ({len(devices.workers)} in all)")
            captured = devices.kernels(job)
            time_all = devices.time_all(args.device, captured)
            profiles = lambda runs: devices.submit(fanout.profile_pair, model, args.device, runs).result()
        result = search([c.kernel for c in captured], fam, target, args.device, args.budget, time_all, ledger,
                        job.sha256, say, args.seconds_per_kernel)
        result.route.families = stored(chosen)
        routes.save(result.route, out / "route.json")
        judgement = None
        if not args.no_judge:
            try:
                judgement = _judge(args, out, say, ledger, result.route, profiles)
            except Refused as e:   # the route and its timings stand; the summary says the judge could not run
                refused = str(e)
    from boltbeam.search.summary import summarize
    summary = summarize(result, target, time.monotonic() - started, out / "route.json", judgement, refused).to_dict()
    write_json(out / "search.json", summary)
    if args.json:
        report.print_json(summary)
    else:
        _print(summary)
    if refused:
        raise Refused(refused)
    return 0


def _choose_whole(model: str, target, args: argparse.Namespace) -> int:
    """A family judged on the whole token: each of its settings, FutureSight's best first (search/choose.py)."""
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from boltbeam.cli.depth import check_depth
    from boltbeam.files import sha256_file, writable_dir, write_json
    from boltbeam.ledger.store import Ledger
    from boltbeam.measure import route as routes
    from boltbeam.read.census import take_census
    from boltbeam.search import alone as alone_timing
    from boltbeam.search.choose import baseline_of, check_on, choose, with_setting
    family = BY_NAME[args.family]
    if args.beam < 0:
        raise BadInput("need --beam >= 0")
    if args.workers or args.scheduler is not None:
        raise BadInput(f"--family {family.name} judges whole tokens in this process: drop --workers and --scheduler")
    if args.layout or args.constants_once or args.no_judge:
        raise BadInput(f"--family {family.name} judges each of its settings itself: drop --layout, "
                       "--constants-once and --no-judge (a route with them goes in --on)")
    if args.alone is not None and (family.name != "gemv" or args.alone < 1 or not args.seconds_per_kernel > 0):
        raise BadInput(f"--alone {args.alone}: geometries timed alone a product go with --family gemv, 1 or more, "
                       f"with --seconds-per-kernel above 0")
    if args.alone_from and args.alone is None:
        raise BadInput("--alone-from orders the geometries --alone times: give --alone K too")
    earlier = alone_timing.earlier_times(args.alone_from) if args.alone_from else None
    census = take_census(model)
    check_depth(census, args.context, args.tokens)
    sha = sha256_file(model)
    on = None
    if args.on:
        on = args.on, routes.load(args.on)
        routes.check_applies(on[1], sha, routes.engine(), args.on)
    check_on(family, *(on or ("none", None)), target)    # one line, before the ledger opens
    beam = args.beam or (on[1].beam if on else 0)     # as profile runs a route: its BEAM width unless --beam
    baseline = None
    if args.baseline:
        baseline = args.baseline, baseline_of(args.baseline, sha, args.device, args.context, beam, on and on[1])
    with Ledger(args.ledger) as ledger:
        out = writable_dir(args.out)
        with Progress(SpinnerColumn(), "[progress.description]{task.description}", TimeElapsedColumn(),
                      console=report.console(), transient=True) as bar:
            task = bar.add_task(f"judging {family.name}'s settings", total=None)
            choice = choose(family, model, census, args.device, args.context, args.tokens, target, ledger, sha, out,
                            lambda what: bar.update(task, description=escape(what)), beam=beam,
                            budget=args.budget, baseline=baseline, on=on, alone=args.alone,
                            seconds=args.seconds_per_kernel, earlier=earlier)
    route = None
    if choice.chosen:
        route = with_setting(family, on and on[1], choice.chosen.setting, sha, args.device, target.name, beam)
        route = routes.judged_by(route, choice.chosen.trace)     # its kernels as BEAM compiled them there
        routes.save(route, out / "route.json")
    summary = {**choice.to_dict(), "beam": beam, "on": args.on,
               "baseline": args.baseline or str(out / "baseline.json"), "route": str(out / "route.json") if route else None}
    write_json(out / "search.json", summary)
    if args.json:
        report.print_json(summary)
    else:
        con = report.console()
        con.print(report.table(f"{family.name} settings in FutureSight's order (without them: "
                               f"{choice.baseline_median_us:,.1f} µs)",
                               ["setting", "predicted µs", "median µs", "verdict", "why"],
                               [[c.flag, f"{c.predicted_us:,.1f}", f"{c.median_us:,.1f}" if c.median_us else "",
                                 c.verdict or "skipped", c.skipped or "; ".join(c.reasons)] for c in choice.candidates],
                               right=(1, 2)))
        if choice.alone:
            con.print(report.table("each product alone: its geometries in FutureSight's order, the fastest chosen",
                                   ["product", "a token", "legal", "timed", "fastest", "µs", "Spearman"],
                                   [[p.key, p.count, p.legal, sum(r.median_us is not None for r in p.timed),
                                     p.best or "none", f"{p.best_us:,.2f}" if p.best_us else "",
                                     "" if p.spearman is None else f"{p.spearman:.2f}"] for p in choice.alone],
                                   right=(1, 2, 3, 5, 6)))
        for reason, n in choice.rejected.items():
            con.print(f"rejected before anything ran: {n:,}: {escape(reason)}")
        con.print(f"chosen: {summary['chosen'] or 'none promoted: no route written'}")
    return 0


def _judge(args: argparse.Namespace, out: Path, say, ledger, route, profiles):
    """Whole tokens without and with the route, each in a fresh process, both on one device (`profiles`);
    the judge's verdict, recorded."""
    from boltbeam.judge.judge import Checks, judge
    from boltbeam.measure import route as routes
    from boltbeam.measure import trace as tracefile
    from boltbeam.route.families import labels
    say("judging: the whole token without and with the route")
    flags = ["--context", str(args.context), "--tokens", str(args.tokens), "--route"]
    if failed := profiles([(str(out / "baseline.json"), [*flags, "none"]),
                           (str(out / "candidate.json"), [*flags, str(out / "route.json")])]):
        raise Refused(f"profiling the whole token failed: {failed}")
    base, cand = tracefile.load(str(out / "baseline.json")), tracefile.load(str(out / "candidate.json"))
    j = judge(base, cand, Checks(expected_route=routes.routed_label(labels(route.families), "boltbeam-search"),
                                 candidate_id=f"route {out / 'route.json'}"))
    ledger.append(candidate=j.candidate_id, verdict=j.verdict, reasons=j.reasons, scope=j.scope.as_json(),
                  evidence=[str(out / f) for f in ("route.json", "baseline.json", "candidate.json")],
                  reopen=j.reopen, actor="boltbeam search")
    return j


def _print(s: dict[str, Any]) -> None:
    from boltbeam.search.decide import INCOMPLETE_RATIO
    c = report.console()
    rows = [(k["name"], k["launches"], f"{k['legal']}/{k['settings']}", k["survivors"], k["timed"],
             f"{k['default_us']:,.2f}", f"{k['best_us']:,.2f}", f"{k['floor_us']:,.3f}",
             "" if k["choice"] is None else ", ".join(f"{p}={v}" for p, v in k["choice"].items() if v != 1) or "no opts")
            for k in s["per_kernel"]]
    c.print(report.table("Kernels of one decode token: legal of all settings, FutureSight's survivors, timed, "
                         "best alone (µs)", ["kernel", "launches", "legal", "survivors", "timed", "default µs",
                                             "best µs", "floor µs", "route"], rows, right=(1, 2, 3, 4, 5, 6, 7)))
    sp = s["space"]
    c.print(f"space: {sp['settings']:,} settings, {sp['legal']:,} legal (token product 10^{sp['token_product_log10']:.1f}"
            f" -> 10^{sp['legal_token_product_log10']:.1f}); FutureSight set aside {sp['foreseen_out']:,}; "
            f"timed {s['timed_now']:,} now, {s['reused_from_ledger']:,} from the ledger, "
            f"{s['seconds_timing']:,.1f} s on the device")
    for reason, n in sp["rejected_by_reason"].items():
        c.print(f"  rejected {n:,}: {escape(reason)}")
    for kind, v in s["spearman"].items():
        rho = "undefined" if v["rho"] is None else f"{v['rho']:.2f}"
        c.print(f"FutureSight against the measurements, {kind} kernels: Spearman {rho} over {v['points']} settings")
    w = s["spearman_within_kernels"]
    c.print(f"FutureSight within each kernel: median Spearman "
            f"{'undefined' if w['median_rho'] is None else format(w['median_rho'], '.2f')} over {w['kernels']} kernels")
    c.print(f"route: {escape(s['route'])}, {s['routed_kernels']} kernel(s) routed")
    for name, why in s["unbuilt"].items():
        c.print(f"not searched: {escape(name)}: tinygrad's own build of it failed ({escape(why)})")
    if s["search_space_incomplete"]:
        c.print(f"search-space-incomplete: {len(s['search_space_incomplete'])} kernel(s) stay over "
                f"{INCOMPLETE_RATIO:g}x their floor "
                f"with every survivor timed")
    if (j := s["judgement"]) is not None:
        c.print(f"whole token: {j['verdict']}")
        for r in j["reasons"]:
            c.print(f"  {escape(r)}")


def _points(summary_path: str, ledger_path: str, target):
    """The measured settings of one search on this target: its summary gives each kernel's work, its
    ledger the times (entries of other targets, and anything that is not a time, are left out)."""
    from boltbeam.judge.scope import ScopeKey
    from boltbeam.ledger.store import Ledger
    from boltbeam.search.decide import measured_us, parse_setting
    from boltbeam.foresight.future import Point, Work
    from boltbeam.search.summary import SearchSummary
    summary = SearchSummary.load(summary_path)
    if any(k.outputs is None for k in summary.per_kernel):
        raise BadInput(f"search summary {summary_path}: its kernels do not say their outputs (an older search)")
    work = {k.kernel: Work(k.bytes or round(k.floor_us * target.bandwidth / 1e6), k.flops or 0, max(1, k.outputs))
            for k in summary.per_kernel}
    out = []
    with Ledger(ledger_path, create=False) as ledger:
        for e in ledger.entries():
            sc = e.scope
            if sc.get(ScopeKey.TARGET) != target.name or (kernel := sc.get(ScopeKey.KERNEL)) not in work:
                continue
            setting, us = parse_setting(sc.get(ScopeKey.SETTING)), measured_us(sc)
            if setting is not None and us is not None:
                out.append(Point(kernel, work[kernel], setting, us))
    if not out:
        raise BadInput(f"ledger {ledger_path}: no timed setting on {target.name} of the kernels in {summary_path}")
    return out


def _calibrate_layout(paths: list[str], target, as_json: bool) -> int:
    from statistics import median

    from boltbeam.search.choose import measured_fraction
    by_writer: dict[str, list[float]] = {}
    for path in paths:
        writer, fraction = measured_fraction(path, target)
        by_writer.setdefault(writer, []).append(fraction)
    result = {"target": target.name, "bandwidth_fraction": {w: round(median(f), 3) for w, f in by_writer.items()},
              "traces": paths}
    if as_json:
        report.print_json(result)
        return 0
    report.console().print(f"[{target.name}.bandwidth_fraction]\n" + "\n".join(
        f"{w} = {f}" for w, f in result["bandwidth_fraction"].items()) + f"\n# from {', '.join(paths)}", markup=False)
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from boltbeam.bound.targets import get_target
    from boltbeam.foresight.future import fit, within_spearman
    if len(args.summary) != len(args.ledger):
        raise BadInput("give --summary and --ledger in pairs, one of each per search")
    target = get_target(args.target, args.targets)
    if args.layout_trace:
        if args.summary:
            raise BadInput("give --summary and --ledger pairs, or --layout-trace: one fit at a time")
        return _calibrate_layout(args.layout_trace, target, args.json)
    if not args.summary:
        raise BadInput("give --summary and --ledger pairs (kernel settings) or --layout-trace (layout products)")
    pairs = [_points(s, l, target) for s, l in zip(args.summary, args.ledger)]
    cal, rho = fit(pairs[0], target)
    held = [dict(zip(("median_rho", "kernels"), within_spearman(p, target, cal))) for p in pairs[1:]]
    result = {"target": target.name, **asdict(cal), "fitted_on": args.summary[0], "points": len(pairs[0]),
              "median_spearman_fitted": rho,
              "held_out": [{"summary": s, **h} for s, h in zip(args.summary[1:], held)]}
    if args.json:
        report.print_json(result)
        return 0
    c = report.console()
    c.print(f"[{target.name}]\nbytes_in_flight_per_thread = {cal.bytes_in_flight_per_thread}\n"
            f"unroll_adds_in_flight = {int(cal.unroll_adds_in_flight)}", markup=False)
    c.print(f"fitted on {args.summary[0]} ({len(pairs[0])} settings): median Spearman within a kernel {rho:.3f}")
    for h in result["held_out"]:
        rho_h = "undefined" if h["median_rho"] is None else f"{h['median_rho']:.3f}"
        c.print(f"held out {h['summary']}: {rho_h} over {h['kernels']} kernels")
    return 0
