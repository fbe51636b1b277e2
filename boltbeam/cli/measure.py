"""`boltbeam profile` (tinygrad runs the model), `boltbeam import KIND FILE --out TRACE.json` (other
engines' measurements) and `boltbeam export-trace TRACE.json --chrome OUT.json` (a trace out to Perfetto)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import statistics
from typing import Any

from boltbeam import report, switches
from boltbeam.errors import BadInput, Refused
from boltbeam.measure import trace as tracefile
from boltbeam.measure.importers import (DEFAULT_TOKEN_MARKER, import_chrome_trace, import_llama_bench,
                                        import_nsys_gpu_trace)
from boltbeam.measure.trace import TIMINGS, Reference, Trace
from boltbeam.report.chrome import TOKEN_TID, write_chrome
from boltbeam.route.families import FAMILIES, Flags
from boltbeam.route.use import families, route_for


def register(sub: argparse._SubParsersAction) -> None:
    _register_profile(sub)
    _register_import(sub)
    _register_export_trace(sub)


# --- profile ------------------------------------------------------------------------------------

def _register_profile(sub: argparse._SubParsersAction) -> None:
    from boltbeam.cli.read import model_arg
    p = sub.add_parser("profile", help="decode through tinygrad (or llama.cpp): whole-token walls and every kernel, "
                                       "one trace")
    model_arg(p)
    profile_flags(p, device_required=True)
    p.add_argument("--out", required=True, metavar="TRACE.json", help="where to write the trace")
    p.add_argument("--host-profile", metavar="FILE", help="after the measured tokens, decode as many more under "
                   "Python's profiler and write where the host's time went (tinygrad; not with --timing launch)")
    p.add_argument("--reference", action="store_true", help="decode the same prompt ids through llama.cpp too (its "
                   "Python binding, llama-cpp-python) and compare its greedy tokens with tinygrad's, step by step: exit "
                   "3 when any differs (tinygrad; the trace keeps llama.cpp's tokens)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_profile)


def profile_flags(p: argparse.ArgumentParser, device_required: bool, depth: bool = True) -> None:
    """The decode run's flags, shared by `profile`, `audit` and (without --context) `sweep`."""
    p.add_argument("--device", required=device_required, choices=["CPU", "CUDA"], help="tinygrad device (DEV)")
    p.add_argument("--engine", choices=["tinygrad", "llama.cpp"], default="tinygrad",
                   help="what runs the model: tinygrad (default), or llama.cpp through llama-cpp-python built "
                        "with CUDA, its kernels timed by CUPTI in its own CUDA graphs (--device CUDA)")
    if depth:
        p.add_argument("--context", type=int, default=0, metavar="N", help="prompt length: KV depth before decoding")
    p.add_argument("--tokens", type=int, default=10, metavar="K", help="measured tokens per pass (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="tokens before measuring (default 3, the JIT's capture)")
    p.add_argument("--beam", type=int, default=0, metavar="N",
                   help="let tinygrad's BEAM search (width N) choose the decode kernels' opts")
    p.add_argument("--timing", choices=[t for t in TIMINGS if t != "import"],
                   help="how kernels are timed: in the graph replay users run (default: cupti on CUDA, "
                        "tinygrad's graph timestamps (hcq) elsewhere), or launch: one by one (CUDA; no in-graph timing)")
    p.add_argument("--no-hash", action="store_true", help="skip the model file's sha256 in the trace")
    p.add_argument("--route", metavar="ROUTE.json", help="run the kernels a search's route names with its settings "
                                                         "(`none`, or BOLTBEAM_ROUTE=none, turns it off)")
    for f in FAMILIES:       # each generated family's flag (route/families.py)
        if f.metavar is None:
            p.add_argument(f.flag, action="store_true", help=f.help)
        else:
            p.add_argument(f.flag, metavar=f.metavar, help=f.help)


def profile_trace(args: argparse.Namespace, model: str) -> Trace:
    """Decode `model` as the profile flags say, with a progress bar on stderr's console."""
    # tinygrad reads its device from the environment when first imported.
    switches.DEV.set(args.device)
    route = route_for(args.route, model, hash_check=not args.no_hash)
    prepare = families(route, family_flags(args))      # before minutes of loading: a bad setting is one line now
    from boltbeam.measure.tinygrad_run import profile
    host = getattr(args, "host_profile", None)      # (profile's flag; audit has none)
    from boltbeam.measure.graph_timing import per_launch_on
    per_launch = args.tokens if args.device == "CUDA" and args.timing in (None, "cupti") and per_launch_on() else 0
    with _decode_bar("loading and compiling", 2 * (args.warmup + args.tokens) + (args.tokens if host else 0)
                     + per_launch) as tick:
        return profile(model, args.device, context=args.context, tokens=args.tokens, warmup=args.warmup,
                       model_hash=not args.no_hash, beam=args.beam or (route[1].load_beam() if route else 0),
                       timing=args.timing, route=route,
                       prepare=prepare, progress=tick, host_profile=host)


def family_flags(args: argparse.Namespace) -> Flags:
    return Flags(**{f.key: getattr(args, f.key) for f in FAMILIES})


@contextlib.contextmanager
def _decode_bar(first: str, total: int):
    """A decode's progress bar on stderr's console; yields the (stage, n) callback the runners take."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=report.console(), transient=True) as bar:
        task = bar.add_task(first, total=total)
        yield lambda stage, n: bar.update(task, advance=n, description=stage)


def _profile(args: argparse.Namespace) -> int:
    from boltbeam.cli.read import resolve_model
    from boltbeam.judge.judge import PASS
    from boltbeam.measure.unread import unread_tensors
    from boltbeam.read.census import take_census
    model = resolve_model(args)
    if args.reference:
        check_reference(args.engine)
    trace = decode_trace(args, model)
    gate = reference(trace, model) if args.reference else None
    code = _save_and_summarize(trace, args, f"profiled {model}")
    if gate is not None:
        report.console().print(gate.sentence)
        if gate.status != PASS:
            raise Refused(f"{gate.sentence} (the trace is written to {args.out})")
    if (unread := unread_tensors(trace, take_census(model))) is not None and not unread.complete:
        raise Refused(f"{unread.sentence()} (the trace is written to {args.out})")
    return code


def check_reference(engine: str = "tinygrad") -> None:
    """--reference (profile, audit, tune): one line, before minutes of profiling, where llama.cpp cannot decode."""
    if engine != "tinygrad":
        raise BadInput("--reference compares tinygrad's tokens with llama.cpp's: not with --engine llama.cpp")
    check_llama_cpp("--reference", "decodes through llama.cpp")


def check_llama_cpp(flag: str, does: str, device: str | None = None) -> None:
    """One line, before minutes of work, where `flag` cannot run llama.cpp here: on a device other than CUDA, where
    `device` is given (llama.cpp's kernels are timed through CUPTI), or without its Python binding."""
    if device is not None and device != "CUDA":
        raise BadInput(f"{flag} times llama.cpp's kernels through CUPTI: it needs --device CUDA")
    if importlib.util.find_spec("llama_cpp") is None:
        raise BadInput(f"{flag} {does}: it needs llama-cpp-python (pip install llama-cpp-python)")


def reference(trace: Trace, model: str):
    """llama.cpp's greedy tokens on the trace's own prompt ids, kept in the trace, against tinygrad's (the judge's
    reference gate, no tolerance)."""
    from boltbeam.judge.judge import reference_gate
    from boltbeam.measure.llama_cpp_run import reference_tokens
    from boltbeam.measure.tinygrad_run import prompt_tokens
    from boltbeam.read.census import take_census
    prompt = prompt_tokens(trace.workload.context, take_census(model).facts.vocabulary)
    with _decode_bar("llama.cpp's reference tokens", len(trace.output_tokens) - 1) as tick:
        tokens, engine = reference_tokens(model, prompt, len(trace.output_tokens) - 1, tick)
    trace.provenance.reference = Reference(engine, tokens)
    return reference_gate(trace, engine, tokens, 0.0)


def decode_trace(args: argparse.Namespace, model: str) -> Trace:
    """The profile flags' decode, by the engine they name."""
    from boltbeam.cli.depth import check_depth
    from boltbeam.read.census import take_census
    check_depth(take_census(model), args.context, args.tokens + args.warmup)   # before the prompt is built
    return llama_trace(args, model) if args.engine == "llama.cpp" else profile_trace(args, model)


def llama_trace(args: argparse.Namespace, model: str) -> Trace:
    """Decode `model` in llama.cpp, with the same progress bar; tinygrad's own flags do not apply."""
    if args.device != "CUDA":
        raise BadInput("--engine llama.cpp times its kernels through CUPTI: it needs --device CUDA")
    tinygrad_only = [f"--{name.replace('_', '-')}" for name in ("beam", "route", *(f.key for f in FAMILIES))
                     if getattr(args, name)] + (["--timing"] if args.timing not in (None, "cupti") else [])
    if tinygrad_only:
        raise BadInput(f"{', '.join(tinygrad_only)} choose(s) tinygrad's route: not with --engine llama.cpp")
    if getattr(args, "host_profile", None):
        raise BadInput("--host-profile profiles tinygrad's decode in this process: not with --engine llama.cpp")
    from boltbeam.measure.llama_cpp_run import profile
    with _decode_bar("loading", 1 + args.warmup + 3 * args.tokens) as tick:
        return profile(model, context=args.context, tokens=args.tokens, warmup=args.warmup,
                       model_hash=not args.no_hash, progress=tick)


# --- import -------------------------------------------------------------------------------------

def _register_import(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="turn another engine's measurements into a BoltBeam trace")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)

    def kind(name: str, help: str) -> argparse.ArgumentParser:
        k = kinds.add_parser(name, help=help, description=help)
        k.add_argument("file", metavar="FILE")
        k.add_argument("--out", required=True, metavar="TRACE.json", help="where to write the trace")
        k.add_argument("--json", action="store_true", help="print the summary as JSON")
        return k

    k = kind("llama-bench", "llama-bench -o json output (whole-token walls per repetition)")
    k.add_argument("--depth", type=int, metavar="N", help="the decode test at KV depth N (n_depth)")
    k.set_defaults(func=_import, read=lambda a: import_llama_bench(a.file, depth=a.depth))

    k = kind("chrome", "Chrome trace JSON as torch.profiler (Kineto) writes it")
    k.add_argument("--tokens", type=int, metavar="K",
                   help="decode tokens in the trace: kernels split into K equal counts when no "
                        "annotation marks tokens; else checked against the annotations")
    k.add_argument("--token-marker", default=DEFAULT_TOKEN_MARKER, metavar="REGEX",
                   help=f"user annotations whose name matches mark one token each (default {DEFAULT_TOKEN_MARKER!r})")
    _run_flags(k)
    k.set_defaults(func=_import, read=lambda a: import_chrome_trace(
        a.file, tokens=a.tokens, token_marker=a.token_marker, engine=a.engine, context=a.context, batch=a.batch))

    k = kind("nsys", "Nsight Systems CSV: nsys stats --report cuda_gpu_trace --format csv")
    k.add_argument("--tokens", type=int, required=True, metavar="K",
                   help="decode tokens in the table: its GPU operations split into K equal counts")
    _run_flags(k)
    k.set_defaults(func=_import, read=lambda a: import_nsys_gpu_trace(
        a.file, tokens=a.tokens, engine=a.engine, context=a.context, batch=a.batch))


def _run_flags(k: argparse.ArgumentParser) -> None:
    """What a profiler trace does not record about the run."""
    k.add_argument("--engine", help="the engine that ran the model (e.g. vllm, tinygrad)")
    k.add_argument("--context", type=int, metavar="N", help="KV depth the tokens decoded at")
    k.add_argument("--batch", type=int, metavar="B", help="sequences decoded per step")


def trace_summary(trace: Trace, out: str) -> dict[str, Any]:
    walls = trace.token_wall_us
    return {"out": out, "source": trace.provenance.source, "engine": trace.environment.engine,
            "device": trace.environment.device, "context": trace.workload.context,
            "token_walls": len(walls), "median_token_wall_us": statistics.median(walls) if walls else None,
            "kernels": len(trace.kernels), "kernel_tokens": len(trace.kernel_tokens),
            "phases_s": dataclasses.asdict(trace.provenance.phases) if trace.provenance.phases else None,
            "notes": trace.provenance.notes or []}


def _import(args: argparse.Namespace) -> int:
    return _save_and_summarize(args.read(args), args, f"imported {args.file}")


def _save_and_summarize(trace: Trace, args: argparse.Namespace, title: str) -> int:
    """Write the trace (all or nothing) and print what it holds."""
    tracefile.save(trace, args.out)
    summary = trace_summary(trace, args.out)
    if args.json:
        report.print_json(summary)
        return 0
    shown = lambda v: f"{v:,.2f}" if isinstance(v, float) else ", ".join(
        f"{k.removesuffix('_s')} {s:,.1f} s" for k, s in v.items()) if isinstance(v, dict) else v
    rows = [(k, shown(v)) for k, v in summary.items() if k != "notes"]
    report.console().print(report.table(title, ["field", "value"], rows))
    for note in summary["notes"]:
        report.console().print(f"  note: {note}")
    return 0


# --- export-trace -------------------------------------------------------------------------------

def _register_export_trace(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-trace", help="write a BoltBeam trace as Chrome trace JSON for Perfetto")
    p.add_argument("trace", metavar="TRACE.json")
    p.add_argument("--chrome", required=True, metavar="OUT.json", help="where to write the Chrome trace")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_export_trace)


def _export_trace(args: argparse.Namespace) -> int:
    trace = tracefile.load(args.trace)
    events = write_chrome(trace, args.chrome)["traceEvents"]
    summary = {"out": args.chrome, "events": len(events), "kernels": len(trace.kernels),
               "tokens": sum(1 for e in events if e["ph"] == "X" and e["tid"] == TOKEN_TID)}
    if args.json:
        report.print_json(summary)
    else:
        report.console().print(f"wrote {summary['events']} events ({summary['kernels']} kernels, "
                               f"{summary['tokens']} tokens) to {args.chrome}; open it in ui.perfetto.dev")
    return 0
