"""Reopen conditions: when may a closed idea be tried again?

A condition in the structured form, `key=value` or `key!=value` clauses joined by `;`
(e.g. `compiler=tinygrad; compiler_version!=0.13.0`), is checked against the asking context:
it is met when every clause holds and the context names every key it asks about (a key the
context does not name is unknown, and unknown is not met). Anything else is free text for a
person to judge; the search never treats free text as met.
"""
from __future__ import annotations

import json
import re
from typing import Any

Clause = tuple[str, str, str]  # key, operator ("=" or "!="), value

_CLAUSE = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*(!=|=)\s*([^=!;]*?)\s*")


def parse(condition: str) -> list[Clause] | None:
    """The clauses of a structured condition, or None when it is free text."""
    parts = [p for p in condition.split(";") if p.strip()]
    clauses = []
    for part in parts:
        m = _CLAUSE.fullmatch(part)
        if m is None or not m[3]:
            return None
        clauses.append((m[1], m[2], m[3]))
    return clauses or None


def as_text(value: Any) -> str:
    """Compare scope and context values as text, so 4 and "4" agree (the CLI only has text)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def unless(key: str, value: str) -> str:
    """The condition met once the asking context's `key` is anything but `value` (another engine, say)."""
    return f"{key}!={value}"


def check(condition: str, context: dict[str, Any]) -> tuple[bool, str]:
    """(met, why): whether the asking context satisfies the condition, and a phrase saying why not."""
    clauses = parse(condition)
    if clauses is None:
        return False, "free text, a person must decide"
    for key, op, value in clauses:
        if key not in context:
            return False, f"the context does not say {key}"
        have = as_text(context[key])
        if (have == value) != (op == "="):
            return False, f"{key} is {have}"
    return True, "met"
