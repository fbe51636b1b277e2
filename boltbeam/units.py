"""Numbers as people read them, shared by every step that writes a sentence (the account's causes, the
tables, the page), and as people write them: every number a flag or a setting string holds is read here,
and every number a file holds is checked here before arithmetic takes it."""
import math
import re

# Digits 0-9 only, and few enough to convert at once: str.isdigit takes '²' and '①', which int() does
# not, and int() takes '١٢' and '1_000', and a number thousands of digits long, which nothing here means.
DIGITS = re.compile(r"[0-9]{1,18}")
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
_REAL = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?")


LIMIT = 2 ** 63   # every number a file holds lies within +-LIMIT: an integer of 400 digits overflows a float


def is_whole(x) -> bool:
    """A whole number as a file holds it: an int (never a bool) within +-LIMIT."""
    return isinstance(x, int) and not isinstance(x, bool) and -LIMIT < x < LIMIT


def is_number(x, limit: float = LIMIT) -> bool:
    """A number as a file holds it: an int or a float (never a bool) within +-limit; nan and inf are not.
    (Python compares an int with a float exactly: no conversion, no overflow.)"""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and -limit < x < limit


def integer(text: str) -> int:
    """A whole number written in ASCII digits, with an optional sign (ValueError otherwise)."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"{text[:24]!r} has more than 18 digits: past any count BoltBeam takes"
                         if re.fullmatch(r"[+-]?[0-9]+", text) else f"not a whole number in digits 0-9: {text[:40]!r}")
    return int(text)


def real(text: str) -> float:
    """A finite number written in ASCII digits, a point and an exponent (no nan, inf or '1_0')."""
    if not _REAL.fullmatch(text) or not math.isfinite(value := float(text)):
        raise ValueError(f"not a finite number in digits 0-9: {text[:40]!r}")
    return value


def fmt_bytes(n: float) -> str:
    """Bytes in decimal units: 612 B, 4.29 TB (the largest unit takes whatever is left)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:,.2f} TB"
