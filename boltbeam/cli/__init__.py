"""The `boltbeam` command: parse, call one step, print. Each pipeline step registers its own
sub-commands from a module here; this file only dispatches and maps errors to exit codes."""
from __future__ import annotations

import argparse
import errno
import os
import re
import sys

from boltbeam import __version__, files, units
from boltbeam.errors import BadInput, Refused

# Sub-command modules, in pipeline order; each has register(subparsers).
MODULES = ["read", "bound", "measure", "account", "judge", "ledger", "search", "audit", "sweep", "tune", "generate"]
# The arguments that name what a command writes; every other argument naming a file is one it reads. A
# command whose --out is a folder sets `out_files` (args -> the names it writes there).
OUTPUTS = ("out", "chrome", "host_profile")


class _Parser(argparse.ArgumentParser):
    # argparse exits 2 on bad arguments already; keep its one-line message, drop the usage dump.
    def error(self, message: str):
        self.exit(2, f"boltbeam: error: {one_line(message)}\n")


# Characters that would break the one line a refusal is: newlines and every other control character (a path,
# a flag's value or a name in a file the message quotes may hold them), written as escapes.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(message: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(prog="boltbeam", description="Keeps the books for LLM decode tokens.")
    parser.add_argument("--version", action="version", version=f"boltbeam {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in MODULES:
        importlib.import_module(f"boltbeam.cli.{name}").register(sub)
    _ascii_numbers(parser)
    return parser


def _ascii_numbers(parser: argparse.ArgumentParser) -> None:
    """Every number flag, of every command, read by one parser: ASCII digits, bounded before converting
    (int() takes '١٢', '1_0' and ten thousand digits; float() takes 'nan' and '1e999')."""
    for action in parser._actions:
        if action.type in (int, float):
            action.type = _said(units.integer if action.type is int else units.real)
        for sub in set((action.choices or {}).values()) if isinstance(action, argparse._SubParsersAction) else ():
            _ascii_numbers(sub)


def _said(read):
    """A number reader whose ValueError is argparse's message (not its bare "invalid value")."""
    def parse(text: str):
        try:
            return read(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with files.reading(_inputs(args)):   # no output replaces an input, whatever path names it
            files.check_outputs(_outputs(args))
            code = args.func(args)
    except BadInput as e:
        print(f"boltbeam: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except Refused as e:
        print(f"boltbeam: refused: {one_line(str(e))}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("boltbeam: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # output piped into `head` and the like: stop quietly
        sys.stderr.close()
        return 0
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            raise
        print(f"boltbeam: error: {one_line(str(e.filename))}: a name longer than the file system allows",
              file=sys.stderr)
        return 2
    return code or 0


def _inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(argument, value) for every argument value that may name a file the command reads."""
    named = []
    for key, value in vars(args).items():
        if key in OUTPUTS or callable(value):
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, (str, os.PathLike)):
                named.append((key, v))
    return named


def _outputs(args: argparse.Namespace) -> list[str]:
    """The files the command will write, as its arguments name them."""
    out = [getattr(args, key, None) for key in OUTPUTS]
    if (names := getattr(args, "out_files", None)) and out[0] is not None:
        out[0:1] = [os.path.join(out[0], name) for name in names(args)]
    return [p for p in out if p is not None]


if __name__ == "__main__":
    sys.exit(main())
