"""File I/O shared by every step: JSON in with one clear error, JSON out all-or-nothing."""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from boltbeam.errors import BadInput


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


GZIP_MAGIC = b"\x1f\x8b"
MAX_UNPACKED = 1 << 30     # a gzipped JSON file may unpack to 1 GiB at most (no gzip bomb reaches memory)


def load_json(path: str | os.PathLike, what: str) -> Any:
    """Read a JSON file a user handed in, plain or gzipped (big traces are kept gzipped); any failure is
    one BadInput line naming the file. NaN and Infinity (which Python's json accepts) are refused: no
    non-finite number reaches arithmetic."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{what} {p}: no such file")
    try:
        with p.open("rb") as f:
            if f.read(2) != GZIP_MAGIC:
                f.seek(0)
                return json.load(f, parse_constant=_no_constant)
        with gzip.open(p, "rb") as g:
            data = g.read(MAX_UNPACKED + 1)
        if len(data) > MAX_UNPACKED:
            raise BadInput(f"{what} {p}: unpacks to more than {MAX_UNPACKED:,} bytes")
        return json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise BadInput(f"{what} {p}: nested too deeply to be what it claims") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as e:   # JSONDecodeError is a ValueError; a cut gzip: EOFError
        raise BadInput(f"{what} {p}: not valid JSON ({e.__class__.__name__}: {e})") from None


def replaceable(path: str | os.PathLike) -> Path:
    """The path, when a new file may take its place: nothing there yet, or a regular file."""
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{p} is a folder, not a file to write")
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise BadInput(f"{p} is not a regular file (a link, a device, a pipe): left untouched")
    return p


def writable_dir(path: str) -> Path:
    """An output folder, made if missing; one clear line when it cannot be."""
    if not str(path).strip():
        raise BadInput("the output folder is empty: name one")
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise BadInput(f"--out {d}: exists and is not a folder")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--out {d}: cannot make the folder ({e.strerror or e})") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise BadInput(f"--out {d}: not writable")
    return d


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside `path`, renamed onto it when the block ends and removed if it fails:
    a reader never sees half a file, and a failed write leaves nothing behind."""
    p = replaceable(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".partial", dir=p.parent)
    except OSError as e:
        raise BadInput(f"cannot write {p}: {e.strerror or e}") from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())   # mkstemp makes it private; the result is an ordinary file
    try:
        yield Path(tmp)
        os.replace(tmp, p)
    except OSError as e:   # a full disk, a quota, a file system gone read-only
        Path(tmp).unlink(missing_ok=True)
        raise BadInput(f"cannot write {p}: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
