"""Show me: terminal tables (rich) and JSON for machines. Every step returns data first; this prints it."""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from boltbeam.units import fmt_bytes

__all__ = ["console", "fmt_bytes", "print_json", "table"]


def console() -> Console:
    # Wide enough for the bound table when piped (rich falls back to 80 columns off a terminal).
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          right: Sequence[int] = ()) -> Table:
    """A rich table; columns whose index is in `right` are right-aligned (numbers). Cells are printed
    as written: a path or reason such as "differs [at step 3]" is escaped, never read as markup."""
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="right" if i in right else "left")
    for r in rows:
        t.add_row(*("" if v is None else escape(str(v)) for v in r))
    return t
