"""File I/O shared by every step: JSON in with one clear error, JSON out all-or-nothing."""
from __future__ import annotations

import contextlib
import gzip
import functools
import hashlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from boltbeam.errors import BadInput


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


class _Unbounded(ValueError):
    """A number a JSON file holds that would overflow the first float it meets."""


def _float_sized_int(text: str) -> int:
    """An integer the file holds, within a float's range (10**309 is an OverflowError in the first arithmetic
    that meets a float; what each field may be, its reader checks and says)."""
    try:
        float(value := int(text))
    except OverflowError:
        raise _Unbounded(f"holds the integer {text[:12]}… of {len(text.lstrip('-')):,} digits, past a float's "
                         f"range") from None
    return value


def _finite_float(text: str) -> float:
    """A number with a point or an exponent, finite (json reads 1e999 as inf)."""
    if not math.isfinite(value := float(text)):
        raise _Unbounded(f"holds the number {text[:24]}, past a float's range")
    return value


# Digits to 0, e and E to e, signs to +, the rest to a space: in that image, a text with no run of 309 digits
# and no 3-digit exponent holds only numbers a float holds, and the plain (C) parse runs; otherwise each
# number is checked as it is parsed (the slower way). (A regex search is 7x slower than this.)
_NUMBER_IMAGE = b"".join(b"0" if 48 <= b <= 57 else b"e" if b in b"eE" else b"+" if b in b"+-" else b" "
                         for b in range(256))


def _maybe_unbounded(data: bytes) -> bool:
    image = data.translate(_NUMBER_IMAGE)
    return b"0" * 309 in image or b"e000" in image or b"e+000" in image


GZIP_MAGIC = b"\x1f\x8b"
# A JSON input, plain or gzipped, holds at most MAX_UNPACKED bytes of text and MAX_VALUES values (each a
# Python object once parsed, tens of bytes where the text spends two: the bytes alone do not bound the
# memory a parse takes). Both are checked before parsing: no gzip bomb or swollen file reaches memory.
MAX_UNPACKED = 256 << 20
MAX_VALUES = 16_000_000


def load_json(path: str | os.PathLike, what: str) -> Any:
    """Read a JSON file a user handed in, plain or gzipped (big traces are kept gzipped); any failure is
    one BadInput line naming the file. NaN and Infinity (which Python's json accepts), 1e999 (which it reads
    as inf) and integers past a float's range are refused: every number converts to a finite float."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{what} {p}: no such file")
    try:
        data = _json_text(p, what)
        bounded = {"parse_int": _float_sized_int, "parse_float": _finite_float} if _maybe_unbounded(data) else {}
        return json.loads(data, parse_constant=_no_constant, **bounded)
    except RecursionError:
        raise BadInput(f"{what} {p}: nested too deeply to be what it claims") from None
    except _Unbounded as e:
        raise BadInput(f"{what} {p}: {e}") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as e:   # JSONDecodeError is a ValueError; a cut gzip: EOFError
        raise BadInput(f"{what} {p}: not valid JSON ({e.__class__.__name__}: {e})") from None


def _json_text(p: Path, what: str) -> bytes:
    """The file's JSON text (unpacked when gzipped), refused before parsing when it is too big to parse."""
    with p.open("rb") as f:
        packed = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not packed and os.fstat(f.fileno()).st_size > MAX_UNPACKED:
            raise BadInput(f"{what} {p}: more than {MAX_UNPACKED:,} bytes of JSON, past what BoltBeam reads")
        data = (gzip.GzipFile(fileobj=f) if packed else f).read(MAX_UNPACKED + 1)
    if len(data) > MAX_UNPACKED:
        raise BadInput(f"{what} {p}: {'unpacks to' if packed else 'holds'} more than {MAX_UNPACKED:,} bytes")
    # every value but a container's first follows a comma: this bounds the objects the parse would make
    values = sum(data.count(c) for c in (b",", b"[", b"{")) + 1
    if values > MAX_VALUES:
        raise BadInput(f"{what} {p}: holds up to {values:,} values, more than the {MAX_VALUES:,} BoltBeam parses")
    return data


# The files the running command reads (the values of its arguments that name files), by identity (device
# and inode), each with what it is: no output may replace one, whatever path names it (relative, a link,
# a hard link). The CLI fills it for the length of one command.
_inputs: dict[tuple[int, int], str] = {}


def _lstat(p: Path) -> os.stat_result | None:
    """The path's own status; None when nothing is there. A name the file system cannot hold is bad input."""
    try:
        return os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise BadInput(f"{p}: {e.strerror or e}") from None


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):   # missing, unreadable, a name too long, a NUL byte: not a file it reads
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


@contextlib.contextmanager
def reading(named: list[tuple[str, str | os.PathLike]]) -> Iterator[None]:
    """While the block runs, the files among `named` ((what it is, path) pairs) are the command's inputs:
    writing onto one is refused."""
    added = {ident: f"{what} {path}" for what, path in named if (ident := _identity(path)) and ident not in _inputs}
    _inputs.update(added)
    try:
        yield
    finally:
        for ident in added:
            del _inputs[ident]


def replaceable(path: str | os.PathLike) -> Path:
    """The path, when a new file may take its place: nothing there yet, or a regular file that is none of
    the command's inputs."""
    p = Path(path)
    st = _lstat(p)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{p} is a folder, not a file to write")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{p} is not a regular file (a link, a device, a pipe): left untouched")
    _not_an_input(p, (st.st_dev, st.st_ino) if st is not None else None)
    return p


def _not_an_input(p: Path, identity: tuple[int, int] | None) -> None:
    if identity is not None and (input_ := _inputs.get(identity)):
        raise BadInput(f"{p} is this command's input ({input_}): it would be replaced by an output; write elsewhere")


def check_outputs(paths: list[str | os.PathLike]) -> None:
    """Before a command runs: no output it will write is one of its inputs (by any name: a link too), and no
    two are one file. (What may stand where an output goes, each write checks: replaceable.)"""
    seen: dict[str, Path] = {}
    for p in map(Path, paths):
        _lstat(p)   # a name the file system cannot hold: one line now, not after the work
        _not_an_input(p, _identity(p))
        if (real := os.path.realpath(p)) in seen:
            raise BadInput(f"{seen[real]} and {p} are one file: name two outputs")
        seen[real] = p


def output_dir(path: str | os.PathLike) -> Path:
    """An output folder, checked but not made (write_all makes it with its files): one clear line when it
    cannot be made or written."""
    if not str(path).strip():
        raise BadInput("the output folder is empty: name one")
    d = Path(path)
    st = _lstat(d)
    if st is not None and not d.is_dir():
        raise BadInput(f"--out {d}: exists and is not a folder")
    nearest = next(a for a in (d.absolute(), *d.absolute().parents) if os.path.lexists(a))
    if not nearest.is_dir():
        raise BadInput(f"--out {d}: cannot make the folder ({nearest} is not a folder)")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise BadInput(f"--out {d}: not writable")
    return d


def writable_dir(path: str | os.PathLike) -> Path:
    """An output folder, made if missing; one clear line when it cannot be."""
    d = output_dir(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInput(f"--out {d}: cannot make the folder ({e.strerror or e})") from None
    return d


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside `path`, renamed onto it when the block ends and removed if it fails:
    a reader never sees half a file, and a failed write leaves nothing behind."""
    p = replaceable(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # (the name cut short: a temporary name must fit where the file's own fits)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:64]}.", suffix=".partial", dir=p.parent)
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


def write_all(files: dict[Path, str | bytes]) -> None:
    """Write every file or none: each into a temporary file beside it, renamed into place only once all are
    made; on a failure (a full disk) the temporary files, and the folders made for them, are removed."""
    for p in files:
        replaceable(p)
    made = [d for p in files for d in reversed([p.parent, *p.parent.parents]) if not os.path.lexists(d)]
    try:
        with contextlib.ExitStack() as stack:
            for path, data in files.items():
                stack.enter_context(atomic_path(path)).write_bytes(data.encode() if isinstance(data, str) else data)
    except BaseException:
        for d in reversed(dict.fromkeys(made)):   # deepest first; only what this call made, and only if empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    write_all({Path(path): data})


def json_text(obj: Any) -> str:
    return json.dumps(obj, indent=1) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json_text(obj))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    """The file's sha256, read once per process for a file unchanged since (a model is GBs: a routed profile
    asks for its hash to check the route and again for the trace)."""
    st = os.stat(path)
    return _sha256(os.path.realpath(path), st.st_size, st.st_mtime_ns, chunk)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int, chunk: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
