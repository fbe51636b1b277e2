"""File I/O shared by every step: JSON in with one clear error, JSON out all-or-nothing."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from boltbeam.errors import BadInput


def load_json(path: str | os.PathLike, what: str) -> Any:
    """Read a JSON file a user handed in; any failure is one BadInput line naming the file."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{what} {p}: no such file")
    try:
        with p.open("rb") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{what} {p}: not valid JSON ({e.__class__.__name__}: {e})") from None


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write to a temporary file beside the target, then rename: a reader never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
