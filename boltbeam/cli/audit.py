"""`boltbeam audit` (the pipeline in one command: census, floors, profile, account, compare, report)
and `boltbeam report` (the page from a trace already taken)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.markup import escape

from boltbeam import report
from boltbeam.errors import BadInput, Refused

OUTPUTS = ("trace.json", "account.json", "audit.json", "report.html")
MAX_REPORT_BYTES = 5_000_000   # the page must stay small enough to mail and open anywhere


def register(sub: argparse._SubParsersAction) -> None:
    from boltbeam.cli.measure import profile_flags
    from boltbeam.cli.read import model_arg
    p = sub.add_parser("audit", help="the whole audit in one command: census, floors, profile, account, compare, "
                                     "one HTML report",
                       description="Census, floors, profile (decode through tinygrad, or llama.cpp with --engine), "
                                   "the tie-out of one token, comparisons, and report.html, written into --out DIR: "
                                   + ", ".join(OUTPUTS)
                                   + ". --trace reuses a trace already taken instead of profiling.")
    model_arg(p)
    profile_flags(p, device_required=False)
    p.add_argument("--trace", metavar="TRACE.json", help="audit this trace instead of profiling (its model: MODEL)")
    p.add_argument("--reference", action="store_true", help="hold the route's greedy tokens to llama.cpp's on the same "
                   "prompt ids (its Python binding, llama-cpp-python; decoded here, nothing timed): the page and the "
                   "summary say so, and --strict exits 3 where any step differs (tinygrad)")
    _page_flags(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the trace, the account, audit.json and "
                                                               "report.html")
    p.set_defaults(func=run_audit, out_files=lambda a: OUTPUTS[1:] if a.trace else OUTPUTS)   # a trace given is not rewritten

    p = sub.add_parser("report", help="one self-contained HTML page of a trace's audit (no network needed to open)",
                       description="The roofline, the tie-out waterfall, region comparisons, one token's timeline "
                                   "and the ledger's verdicts, each chart with its numbers beside it.")
    p.add_argument("trace", metavar="TRACE.json")
    p.add_argument("--model", metavar="MODEL.gguf", help="the model the trace ran (default: its recorded path, "
                                                         "or the embedded model when the hash says so)")
    _page_flags(p)
    p.add_argument("--out", required=True, metavar="REPORT.html", help="where to write the page")
    p.set_defaults(func=run_report)


def _page_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="a target name (see `boltbeam targets`; default: the one whose device_name a "
                                    "trace recorded, or host for a CPU trace taken here or a profile on the CPU)")
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")
    p.add_argument("--compare", action="append", default=[], metavar="FILE",
                   help="a second trace, or llama-bench JSON, to compare region by region (repeatable)")
    p.add_argument("--exclusive", action="store_true",
                   help="compare counting each µs of device time once (shared time to the kernel that started "
                        "first; see `boltbeam compare --exclusive`)")
    p.add_argument("--ledger", metavar="LEDGER", help="a ledger whose verdicts the page lists")
    p.add_argument("--search", metavar="SEARCH.json", help="a `boltbeam search` summary: the page draws its funnel")
    p.add_argument("--price-per-hour", type=float, metavar="USD",
                   help="the device's price per hour (default: the target's price_per_hour fact)")
    p.add_argument("--no-hash-check", action="store_true",
                   help="skip checking the trace's model_sha256 against the model file")
    p.add_argument("--strict", action="store_true", help="exit 3 when the account does not close, a tensor of "
                   "the file was never read by a measured token, or (audit --reference) the output is not llama.cpp's")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


class _Inputs:
    """Everything the user handed in, read and checked before any long step runs."""

    def __init__(self, args: argparse.Namespace, context: int | None, trace=None):
        from boltbeam.account.compare import placed
        from boltbeam.account.price import price_of
        from boltbeam.bound.targets import HOST, get_target, target_of
        from boltbeam.report.audit import load_funnel, load_other, read_ledger
        if args.target or trace is None and getattr(args, "device", None) == "CPU":
            self.target = get_target(args.target or HOST, args.targets)
        elif trace is not None:
            env = trace.environment
            self.target = target_of(env.device_name, env.device, env.host, args.targets)
        else:
            raise BadInput(f"audit on {args.device} needs --target (see `boltbeam targets`)")
        self.price = price_of(self.target, args.price_per_hour)
        self.others = [(path, load_other(path, context)) for path in args.compare]
        self.exclusive = args.exclusive
        for path, other in self.others if self.exclusive else ():
            if not placed(other):
                raise BadInput(f"{path}: --exclusive needs every kernel's start time, and its kernels have none")
        self.ledger = read_ledger(args.ledger) if args.ledger else None
        self.funnel = load_funnel(args.search) if args.search else None


def run_audit(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from boltbeam.bound.roofline import bound
    from boltbeam.cli.account import check_model
    from boltbeam.cli.depth import check_depth
    from boltbeam.cli.measure import decode_trace
    from boltbeam.cli.read import resolve_model
    from boltbeam.measure import trace as tracefile
    from boltbeam.files import output_dir
    from boltbeam.read.census import take_census
    if args.trace is None and args.device is None:
        raise BadInput("audit needs --device to profile (or --trace to audit a trace already taken)")
    model = resolve_model(args)
    given = tracefile.load(args.trace) if args.trace else None
    if args.reference:      # before minutes of profiling
        from boltbeam.cli.measure import check_reference
        check_reference(given.environment.engine if given else args.engine)
    context = given.workload.context if given else args.context
    inputs = _Inputs(args, context, given)
    out = output_dir(args.out)   # made with its files: a failed audit leaves no folder behind
    started = time.monotonic()
    steps = Progress(SpinnerColumn(), "[progress.description]{task.description}", TimeElapsedColumn(),
                     console=report.console(), transient=True)

    def step(what: str):
        steps.update(task, description=what)

    with steps:
        task = steps.add_task("census", total=None)
        census = take_census(model)
        check_depth(census, context or 0)
        step("floors")
        b = bound(census, inputs.target, context=context or 0, batch=1)
        if given is not None:
            trace, trace_path = given, args.trace
            if not args.no_hash_check:
                check_model(trace, model)
        else:
            step(f"profile (decoding through {args.engine})")
            trace, trace_path = decode_trace(args, model), str(out / "trace.json")
        output = None
        if args.reference:
            from boltbeam.cli.measure import reference
            from boltbeam.report.audit import OutputCheck
            step("llama.cpp's reference tokens on the same prompt ids")
            gate = reference(trace, model)      # (the trace written keeps llama.cpp's tokens)
            output = OutputCheck(trace.provenance.reference.engine, "audit --reference: decoded here on the "
                                 "trace's prompt ids", gate.status, gate.sentence)
        step("account, comparisons, report")
        html_path, audit = _audit_files(trace, trace_path, model, b, inputs, out, profiled=given is None, output=output)
    return _summarize(audit, html_path, started, args)


def _audit_files(trace, trace_path, model, b, inputs: _Inputs, out: Path, profiled: bool, output=None):
    """Assemble the audit and write its files, all together or none; `output`: the route's tokens held to a
    reference decoded here (else to a compared trace of another engine, where one serves)."""
    from boltbeam.files import json_text, write_all
    from boltbeam.report.audit import assemble
    from boltbeam.report.page import render
    audit = assemble(trace, trace_path, model, inputs.target, b, inputs.price, inputs.others, inputs.ledger,
                     funnel=inputs.funnel, exclusive=inputs.exclusive, output=output)
    html = _checked_size(render(audit))
    acc_doc = {"trace": trace_path, "model": model, **(audit.account.to_dict() if audit.account else {}),
               "returns": audit.returns.to_dict() if audit.returns else None}
    html_path = out / "report.html"
    write_all({**({out / "trace.json": json_text(trace.to_dict())} if profiled else {}),
               **({out / "account.json": json_text(acc_doc)} if audit.account else {}),
               out / "audit.json": json_text(audit.to_dict()), html_path: html})
    return html_path, audit


def _checked_size(html: str) -> str:
    size = len(html.encode())
    if size > MAX_REPORT_BYTES:
        raise Refused(f"the report would be {size:,} bytes, over its {MAX_REPORT_BYTES:,}-byte limit")
    return html


def run_report(args: argparse.Namespace) -> int:
    from boltbeam.bound.roofline import bound
    from boltbeam.cli.account import check_model, model_of
    from boltbeam.files import write_atomic
    from boltbeam.measure import trace as tracefile
    from boltbeam.read.census import take_census
    from boltbeam.report.audit import assemble
    from boltbeam.report.page import render
    started = time.monotonic()
    trace = tracefile.load(args.trace)
    model = args.model or model_of(trace)
    if not args.no_hash_check:
        check_model(trace, model)
    inputs = _Inputs(args, trace.workload.context, trace)
    b = bound(take_census(model), inputs.target, context=trace.workload.context or 0, batch=1)
    audit = assemble(trace, args.trace, model, inputs.target, b, inputs.price, inputs.others, inputs.ledger,
                     funnel=inputs.funnel, exclusive=inputs.exclusive)
    write_atomic(args.out, _checked_size(render(audit)))
    return _summarize(audit, Path(args.out), started, args)


def _summarize(audit, html_path: Path, started: float, args: argparse.Namespace) -> int:
    acc, ret = audit.account, audit.returns
    summary = {"report": str(html_path), "bytes": html_path.stat().st_size, "seconds": time.monotonic() - started,
               "wall_us": audit.wall_us, "tok_s": 1e6 / audit.wall_us, "floor_us": audit.bound.token_floor_us,
               "ceiling_tok_s": audit.bound.ceiling_tok_s,
               "account": "none" if acc is None else "refused" if acc.refusals else "closed",
               "why": audit.no_account if acc is None else "; ".join(acc.refusals) or None,
               "usd_per_mtok": ret.measured.usd_per_mtok if ret else None,
               "usd_per_mtok_at_ceiling": ret.ceiling.usd_per_mtok if ret else None,
               "biggest_whatif": ret.whatifs[0].label if ret and ret.whatifs else None,
               "tensors_read": None if audit.unread is None else audit.unread.sentence(),
               "output": f"{audit.output.status}: checked against reference engine {audit.output.engine} "
                         f"({audit.output.path}): {audit.output.sentence}" if audit.output
               else "checked against no reference engine: the route's own tokens only"}
    if args.json:
        report.print_json(summary)
    else:
        rows = [(k, f"{v:,.2f}" if isinstance(v, float) else v) for k, v in summary.items() if v is not None]
        report.console().print(report.table(f"audit of {escape(audit.trace_path)}", ["field", "value"], rows))
    refusals = [*(acc.refusals if acc else []), *([audit.unread.sentence()] if audit.unread and not audit.unread.complete
                                                  else []),
                *([audit.output.sentence] if getattr(args, "reference", False) and audit.output.status != "pass"
                  else [])]
    if args.strict and refusals:
        raise Refused("; ".join(refusals))
    return 0
