"""The `boltbeam` command: parse, call one step, print. Each pipeline step registers its own
sub-commands from a module here; this file only dispatches and maps errors to exit codes."""
from __future__ import annotations

import argparse
import sys

from boltbeam import __version__
from boltbeam.errors import BadInput, Refused

# Sub-command modules, in pipeline order; each has register(subparsers).
MODULES = ["read", "bound", "measure", "account", "judge", "ledger", "search", "audit"]


class _Parser(argparse.ArgumentParser):
    # argparse exits 2 on bad arguments already; keep its one-line message, drop the usage dump.
    def error(self, message: str):
        self.exit(2, f"boltbeam: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(prog="boltbeam", description="Keeps the books for LLM decode tokens.")
    parser.add_argument("--version", action="version", version=f"boltbeam {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in MODULES:
        importlib.import_module(f"boltbeam.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except BadInput as e:
        print(f"boltbeam: error: {e}", file=sys.stderr)
        return 2
    except Refused as e:
        print(f"boltbeam: refused: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("boltbeam: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # output piped into `head` and the like: stop quietly
        sys.stderr.close()
        return 0
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
