"""Numbers as people read them, shared by every step that writes a sentence (the account's causes, the
tables, the page)."""


def fmt_bytes(n: float) -> str:
    """Bytes in decimal units: 612 B, 4.29 TB (the largest unit takes whatever is left)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:,.2f} TB"
