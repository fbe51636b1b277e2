"""File I/O shared by every step: JSON in with one clear error, JSON out all-or-nothing."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside `path`, renamed onto it when the block ends and removed if it fails:
    a reader never sees half a file, and a failed write leaves nothing behind."""
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{p} is a folder, not a file to write")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".partial", dir=p.parent)
    except OSError as e:
        raise BadInput(f"cannot write {p}: {e.strerror or e}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
