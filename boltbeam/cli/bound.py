"""`boltbeam targets`, `boltbeam measure-target` and `boltbeam bound`."""
from __future__ import annotations

from rich.markup import escape

from boltbeam.cli.read import model_arg, resolve_model
from boltbeam.errors import BadInput
from boltbeam.report import console, fmt_bytes, print_json, table


def register(sub) -> None:
    p = sub.add_parser("targets", help="the target registry: chip facts with unit, status, source and date")
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_targets)

    p = sub.add_parser("measure-target", help="measure this device's memory bandwidth through tinygrad; print a target entry")
    p.add_argument("--name", default="measured", help="name of the target entry to print")
    p.add_argument("--description", default="measured by boltbeam measure-target")
    p.add_argument("--size-mb", type=int, default=1024, help="buffer size for the bandwidth runs")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--matmul", type=int, default=0, metavar="N", help="also time an N x N x N fp16 matrix product")
    p.add_argument("--beam", type=int, default=0, metavar="N", help="let tinygrad's BEAM search pick the kernels' opts")
    p.add_argument("--launch", action="store_true",
                   help="also measure launch and synchronization cost (decodes of synthetic calibration models, "
                        "timed as `profile` times kernels): the account's launch line")
    p.add_argument("--out", help="also write the raw samples as JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_measure_target)

    p = sub.add_parser("bound", help="floors by physics per role and per token, and the ceiling in tokens/s")
    model_arg(p)
    p.add_argument("--target", required=True, help="a target name (see `boltbeam targets`)")
    p.add_argument("--targets", action="append", metavar="FILE", help="extra targets file (TOML)")
    p.add_argument("--context", type=int, default=0, help="KV-cache depth in tokens (default 0)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--kv-bytes", type=int, default=2, help="bytes per KV-cache element (default 2: f16)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_bound)


def run_targets(args) -> int:
    from boltbeam.bound.targets import HOST, registry
    targets = registry(args.targets)
    if args.json:
        print_json({name: t.to_dict() for name, t in targets.items()})
        return 0
    c = console()
    for t in targets.values():
        shown = table(escape(f"{t.name}: {t.description}"), ["fact", "value", "unit", "status", "source", "date"],
                      [(k, _value(f.value), f.unit, f.status, f.source, f.date) for k, f in t.facts.items()], right=(1,))
        shown.columns[0].no_wrap, shown.columns[0].min_width = True, max(map(len, t.facts))   # the source wraps instead
        c.print(shown)
    if HOST not in targets:
        c.print(f"{HOST}: this machine, measured on first use (`boltbeam bound ... --target {HOST}`) and cached")
    return 0


def _value(v: float) -> str:
    """A count or a size in whole units as digits (65,536), anything else in four significant figures."""
    return f"{v:,.0f}" if v.is_integer() and abs(v) < 1e7 else f"{v:.4g}"


def run_measure_target(args) -> int:
    from boltbeam.bound.measure_target import measure, target_toml
    from boltbeam.files import write_json
    if args.size_mb < 1 or args.reps < 3:
        raise BadInput("--size-mb must be >= 1 and --reps >= 3")
    m = measure(size_bytes=args.size_mb << 20, reps=args.reps, matmul_n=args.matmul, beam=args.beam)
    if args.launch:
        from dataclasses import asdict

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        from boltbeam.measure.launch_cost import DEPTHS, measure_launch_cost
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:   # stdout is the TOML
            task = bar.add_task("decoding calibration models", total=len(DEPTHS))
            m["launch"] = asdict(measure_launch_cost(m["device"], progress=lambda n: bar.advance(task, n)))
    if args.out:
        write_json(args.out, m)
    if args.json:
        print_json(m)
    else:
        print(target_toml(args.name, args.description, m), end="")
    return 0


def run_bound(args) -> int:
    from boltbeam.bound.roofline import bound
    from boltbeam.bound.targets import get_target
    from boltbeam.cli.depth import check_depth
    from boltbeam.read.census import take_census
    census = take_census(resolve_model(args))
    check_depth(census, args.context)
    b = bound(census, get_target(args.target, args.targets), context=args.context, batch=args.batch,
              kv_bytes_per_element=args.kv_bytes)
    d = b.to_dict()
    if args.json:
        print_json(d)
        return 0
    c = console()
    rows = [(r["role"], r["count"], r["format"] or "", f"{r['bytes']:,}", f"{r['flops']:,}",
             "" if r["intensity"] is None else f"{r['intensity']:.2f}", f"{r['floor_memory_us']:.2f}",
             f"{r['floor_compute_us']:.2f}", r["limit"], f"{r['floor_us']:.2f}",
             "" if r["crossover_batch"] is None else f"{r['crossover_batch']:.0f}") for r in d["roles"]]
    c.print(table(f"Floors on {b.target}, context {b.context}, batch {b.batch}, biggest first",
                  ["role", "n", "format", "bytes", "flops", "flop/B", "mem µs", "compute µs", "binds", "floor µs",
                   "compute-bound from batch"], rows, right=(1, 3, 4, 5, 6, 7, 9, 10)))
    c.print(f"bytes per step: {b.bytes_per_step:,} ({fmt_bytes(b.bytes_per_step)}) at {b.bandwidth_bytes_per_s / 1e9:,.1f} GB/s")
    c.print(f"token floor: [bold]{b.token_floor_us:,.1f} µs[/bold]; ceiling: [bold]{b.ceiling_tok_s:,.1f} tokens/s[/bold]"
            + (f" ({b.batch} sequences)" if b.batch > 1 else ""))
    crossing = [r for r in b.roles if r.crossover_batch]
    if crossing:
        lo = min(r.crossover_batch for r in crossing)
        c.print(f"weight roles turn compute-bound from batch (or prefill length) {lo:.0f} "
                f"({min(crossing, key=lambda r: r.crossover_batch).role} first)")
    for note in b.notes + census.notes:
        c.print(f"note: {escape(note)}")
    return 0
