"""`boltbeam tune`: the whole-token families one after another, each judged against the route so far, within a
time budget; the route, the record of every step and the journey's page."""
from __future__ import annotations

import argparse
import time

from rich.markup import escape

from boltbeam import report, switches
from boltbeam.cli.search import JUDGE_TOKENS
from boltbeam.errors import BadInput

OUTPUTS = ("route.json", "tune.json", "report.html")
ALONE, SECONDS = 64, 20.0     # gemv's products timed alone: geometries and seconds a product (8 shapes on the 8B)
PROCESSES = 2                 # a side's processes (judge_processes)
# A verdict whose first processes (one a side, or a batch of --workers) are inconclusive, or moved the median token by
# at least this fraction, every pair the same way, is judged on them (search/choose.py settled): ~3x the 3.6% one
# route's processes measured apart on one H200 (bench/h200/pooled/), so a later process is not expected to turn it.
DECISIVE = 0.10


def register(sub: argparse._SubParsersAction) -> None:
    from boltbeam.cli.read import model_arg
    p = sub.add_parser("tune", help="from tinygrad's own route to the fastest the generated families reach: each family's "
                                    "settings judged on the whole token against the route so far, within --minutes",
                       description="Writes into --out DIR: " + ", ".join(OUTPUTS) + " (all or none), and the whole-token "
                                   "traces and each step's route under DIR/traces/. Every verdict goes in the ledger; a "
                                   "second tune on the same ledger reads them and times nothing it judged before. The "
                                   "order: of the families the route can take, first the one whose best setting "
                                   "FutureSight predicts saves the most against the route's own setting of it, or, where "
                                   "the route sets none, against the time the route's profile (the first family's "
                                   "baseline) spends in what the family replaces.")
    model_arg(p)
    p.add_argument("--device", required=True, choices=["CPU", "CUDA"], help="tinygrad device (DEV)")
    p.add_argument("--target", required=True, help="the chip's declared facts (see `boltbeam targets`)")
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the route, tune.json, report.html and traces")
    p.add_argument("--minutes", type=float, default=60.0, metavar="M",
                   help="no new setting starts after M minutes (default 60); what is left is said and recorded")
    p.add_argument("--ledger", default=".boltbeam/ledger.sqlite", metavar="L", help="the ledger (created if missing)")
    p.add_argument("--context", type=int, default=0, metavar="N", help="KV depth the decode token runs at")
    p.add_argument("--tokens", type=int, default=JUDGE_TOKENS, metavar="K",
                   help=f"whole tokens per side for the judge (default {JUDGE_TOKENS}, at least 5)")
    p.add_argument("--budget", type=int, metavar="K", help="settings judged per family at most, one a round: first "
                   "each family's best predicted setting, then each one's next best on the route the round before "
                   "left, and so on (default: rounds until --minutes or every legal setting is spent)")
    p.add_argument("--families", metavar="A,B,...", help="only these whole-token families, in tune's order of "
                   "predicted savings (default: every one)")
    p.add_argument("--alone", type=int, default=ALONE, metavar="K", help="gemv: first time each product alone at its K "
                   f"best predicted geometries and judge the fastest geometry for each product first (default {ALONE}; "
                   "0: only geometries shared by every product)")
    p.add_argument("--seconds-per-kernel", type=float, default=SECONDS, metavar="S",
                   help=f"with --alone: at most S seconds of timing a product (default {SECONDS:g})")
    p.add_argument("--processes", type=int, default=PROCESSES, metavar="P", help="processes a side for each verdict: "
                   "every pair of a baseline's and a candidate's processes must give it (one route's processes on one "
                   f"H200 measured 3.6%% apart; default {PROCESSES})")
    p.add_argument("--decisive", type=float, default=100 * DECISIVE, metavar="PCT", help="a verdict whose first "
                   "processes (one a side, or a batch of --workers) are inconclusive, or moved the median token by PCT%% "
                   "or more, every pair the same way, is judged on them; the other processes of both sides run only for "
                   f"a closer change (default {100 * DECISIVE:g}, about three times the spread between processes; 0: "
                   "every process runs; nothing to settle where --workers equals --processes)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="run N of a side's processes at once, each on "
                   "a GPU of its own (the first N that CUDA_VISIBLE_DEVICES names, else GPUs 0 to N-1; --device CUDA): "
                   "two GPUs halve the wall of --processes 2 (default 1)")
    p.add_argument("--beam", type=int, default=0, metavar="W", help="the last step: the route so far with tinygrad's "
                   "BEAM at width W for the kernels its families leave to tinygrad, judged like a family; promoted, "
                   "the route carries what BEAM chose (default 0: no BEAM)")
    p.add_argument("--reference", action="store_true", help="hold each setting's output to llama.cpp's greedy tokens on "
                   "the same prompt ids (its Python binding, llama-cpp-python; decoded once, nothing timed), not only "
                   "to tinygrad's default route's: a setting whose tokens differ is not promoted")
    p.add_argument("--compare", choices=["llama.cpp"], help="after the tune, profile this engine's token at the same "
                   "depth and tokens in a process of its own (llama-cpp-python) and draw it beside the journey")
    p.add_argument("--json", action="store_true", help="print tune.json")
    p.set_defaults(func=run, out_files=lambda a: list(OUTPUTS))


def run(args: argparse.Namespace) -> int:
    switches.DEV.set(args.device)   # tinygrad reads its device when first imported (gemv's products timed alone here)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from boltbeam.bound.targets import get_target
    from boltbeam.cli.depth import check_depth
    from boltbeam.cli.read import resolve_model
    from boltbeam.files import json_text, output_dir, sha256_file, write_all
    from boltbeam.ledger.store import Ledger
    from boltbeam.read.census import take_census
    from boltbeam.report.page import render_tune
    from boltbeam.search.choose import gpus
    from boltbeam.search.tune import beside, reference_of, tunable, tune
    if (not args.minutes > 0 or args.tokens < 5 or args.context < 0 or (args.budget is not None and args.budget < 1)
            or args.alone < 0 or not args.seconds_per_kernel > 0 or args.beam < 0 or args.processes < 1
            or not 1 <= args.workers <= args.processes or not 0 <= args.decisive <= 100):
        raise BadInput("need --minutes above 0, --tokens >= 5 (the judge's minimum), --context >= 0, --budget >= 1, "
                       "--alone >= 0, --seconds-per-kernel above 0, --beam >= 0, --processes >= 1, --workers from 1 "
                       "to --processes and --decisive from 0 to 100")
    if args.workers > 1:
        if args.device != "CUDA":
            raise BadInput(f"--workers {args.workers} places a side's processes on GPUs of their own: on {args.device} "
                           f"they would share the cores their tokens are timed on")
        gpus(args.workers)      # CUDA_VISIBLE_DEVICES naming too few: one line before anything runs
    if args.reference:
        from boltbeam.cli.measure import check_reference
        check_reference()
    if args.compare:
        from boltbeam.cli.measure import check_llama_cpp
        check_llama_cpp(f"--compare {args.compare}", "profiles llama.cpp's token", args.device)
    families = tunable(args.families.split(",") if args.families else None)
    model = resolve_model(args)
    target = get_target(args.target, args.targets)
    census = take_census(model)      # a missing model or no GGUF: one line, before anything is written
    check_depth(census, args.context, args.tokens)
    out = output_dir(args.out)
    sha = sha256_file(model)
    reference = None
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), "profiles",
                  TimeElapsedColumn(), TimeRemainingColumn(), console=report.console(), transient=True) as bar:
        task = bar.add_task("tune", total=None)
        if args.reference:      # once, before the ledger or a trace is written: a refusal leaves nothing behind
            bar.update(task, description="llama.cpp's reference tokens on the same prompt ids")
            reference = reference_of(model, census, args.device, args.context, args.tokens)
        deadline = time.monotonic() + args.minutes * 60
        say = lambda what: bar.update(task, description=escape(
            f"{what} ({max(0.0, deadline - time.monotonic()) / 60:,.1f} min of the budget left)"))
        left = lambda n: bar.update(task, total=bar.tasks[0].completed + n)
        with Ledger(args.ledger) as ledger:
            done, route = tune(model, census, args.device, target, args.context, args.tokens, ledger, sha, out,
                               families, args.budget, args.minutes, say, lambda: bar.advance(task), left, reference,
                               args.alone or None, args.seconds_per_kernel, args.beam, args.processes, args.workers,
                               args.decisive / 100)
        if args.compare:
            bar.update(task, description=f"{args.compare}'s token at the same depth")
            done.beside = beside(args.compare, model, args.device, args.context, args.tokens, out)
    record = done.to_dict()
    write_all({out / "route.json": json_text(route.to_dict()), out / "tune.json": json_text(record),
               out / "report.html": render_tune(done)})
    if args.json:
        report.print_json(record)
    else:
        _print(done, out)
    return 0


def _print(done, out) -> None:
    from boltbeam.foresight.future import PER_KERNEL_FACT
    from boltbeam.report.page import sides_text
    con = report.console()
    tok_s = lambda us: "" if us is None else f"{1e6 / us:,.1f}"
    predicted = lambda us: "" if us is None else f"{us:,.1f}"
    judged = [s for s in done.steps if s.verdict]
    con.print(report.table(f"{done.model} on {done.target}: each setting judged against the route so far (* joined it)",
                           ["round", "family", "setting", "predicted µs", "tok/s before", "tok/s with it",
                            "processes", "verdict", "ledger"],
                           [[str(s.round), s.family, s.setting + (" *" if s.promoted else ""), predicted(s.predicted_us),
                             tok_s(s.before_us), tok_s(s.after_us), sides_text(s.sides),
                             s.verdict, f"#{s.ledger_id}" + ("" if s.timed else " (read)")] for s in judged],
                           right=(0, 3, 4, 5)))
    for u in done.not_judged():
        con.print(f"not judged: {u.family}, {u.settings} setting(s): {escape(u.why)}")
    for s in done.skipped:
        con.print(f"skipped {s.family}: {escape(s.why)}")
    if done.out_of_time:
        con.print(f"out of time: the {done.minutes:g} minute(s) were spent; a second tune on the same ledger goes on "
                  f"from here")
    for s in judged:
        if not s.promoted and s.reasons:
            con.print(f"not promoted: {s.family} {s.setting}, {s.verdict}: {escape(s.reasons[0])}")
    con.print("the order: " + "; ".join(escape(_turn(o)) for o in done.order))
    con.print(f"the output: {done.checked_against}")
    if done.unmeasured:
        con.print(f"FutureSight has measured no fraction of the bandwidth on {done.target} for products written as "
                  f"{', '.join(done.unmeasured)}: it predicts them at the full bandwidth, so their settings may tie and "
                  f"keep spaces.toml's order (`boltbeam search-calibrate --layout-trace` measures them)")
    if done.kernel_cost_s is None:
        con.print(f"FutureSight has no measured cost of a kernel on {done.target} ({PER_KERNEL_FACT}): it prices "
                  f"kernels at nothing, and among equal predictions judges the setting of fewest kernels first "
                  f"(`boltbeam measure-target --launch` on the target measures it)")
    if done.start_output:
        con.print(f"tinygrad's own route: {escape(done.start_output)}")
    if done.final_account:
        acc = done.final_account
        con.print(f"the route written, accounted on {done.target}: {'closes' if acc.closed else 'does not close'}, "
                  f"residual {acc.residual_us:+,.2f} µs of {acc.wall_us:,.2f}")
    elif done.no_account:
        con.print(f"the route written has no account: {escape(done.no_account)}")
    if done.beside:
        b = done.beside
        con.print(f"{b.engine} beside, at the same depth: " + (escape(f"not measured: {b.why}") if b.median_us is None
                  else f"{b.median_us:,.1f} µs a token ({1e6 / b.median_us:,.1f} tok/s)" + (
                      f"; the route's is {b.median_us / done.final_us:.2f}x as fast" if done.final_us else "")))
    con.print(f"tok/s: {tok_s(done.start_us) or 'not measured'} -> {tok_s(done.final_us) or 'not measured'} "
              f"({len(done.promoted)} setting(s) promoted); {done.profiles} whole token(s) profiled now, "
              f"{sum(not s.timed for s in judged)} verdict(s) read from the ledger, in {done.seconds:,.0f} s")
    con.print(f"wrote {out / 'route.json'}, {out / 'tune.json'}, {out / 'report.html'}")


def _turn(o) -> str:
    """A family's turn in the order, and what priced it."""
    from boltbeam.search.tune import ROUTE_SETTING
    if o.gain_us is None:
        return f"{o.family} (not priced: {o.why})"
    if o.against == ROUTE_SETTING:
        against = f"FutureSight's {o.against_us:,.1f} µs for the route's own setting"
    else:
        against = "the route's profile's " + " + ".join(
            f"{'host step' if part == 'host' else part} {us:,.1f}" for part, us in o.replaced_us.items()) + " µs"
    return f"{o.family} saves {o.gain_us:,.1f} µs predicted ({against} less FutureSight's {o.best_us:,.1f} µs for {o.best})"
