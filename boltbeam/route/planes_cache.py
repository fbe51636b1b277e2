"""The repacked layout's checked planes kept on disk, so a model is repacked once, not once a process.

Repacking the 8B-shaped file's 253 matrices took 138 s of a 299 s profile on an H100 (bench/h200/s17/), and every
profile of a route with the layout, every setting `search` and `tune` judge among them, starts a process that
repacks again. The planes a run built and checked against the default route's weights are written as they are
built into a NumPy archive (a zip of .npy arrays, read back with pickles refused) in the cache folder beside the
measured `host` target: one file a model file and scale type, holding the model's size and modification time, so
an edited or replaced file is repacked again and its archive replaced. The archive lands whole or not at all; one
that cannot be read as written (cut short, another version's, a matrix of another shape) is repacked and replaced,
never trusted; a run that cannot write one goes on without. `BOLTBEAM_PLANES_CACHE` names another folder, or
`off`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from boltbeam import switches
from boltbeam.errors import BadInput
from boltbeam.files import atomic_path

VERSION = 1                  # raised whenever repack's planes change
PARTS = ("low", "high", "scale", "offset")
MANIFEST = "manifest.json"   # the model's identity, and each matrix's: matched, zero point
# what reading an archive that is not as written raises (a member cut short or altered: zipfile's CRC check)
UNREADABLE = (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile)
HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def path_for(model_path: str, scale_dtype: str) -> Path | None:
    """Where this model's planes are kept (None: the cache is off)."""
    folder = switches.PLANES_CACHE.value
    if folder == "off":
        return None
    name = hashlib.sha256(os.path.realpath(model_path).encode()).hexdigest()[:32]
    return Path(folder or Path(switches.CACHE_HOME.value or Path.home() / ".cache") / "boltbeam" / "planes") / \
        f"{name}-{scale_dtype}.npz"


def identity(model_path: str, scale_dtype: str) -> dict:
    st = os.stat(model_path)
    return {"version": VERSION, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "scale_dtype": scale_dtype}


@dataclass(frozen=True)
class Kept:
    """One matrix's record in the archive: whether its planes matched the default route (else it keeps the
    default, and the archive holds no arrays of it) and its zero point."""
    matched: bool
    zero: int


class Stored:
    """An archive open for reading: each matrix's record, each array's shape and type, the arrays one at a time."""
    def __init__(self, z: zipfile.ZipFile, manifest: dict):
        self.zip, self.matrices = z, {}
        self.shapes = {}
        for info in z.infolist():
            if info.filename.endswith(".npy"):
                with z.open(info) as f:
                    read = HEADERS.get(np.lib.format.read_magic(f))
                    if read is None:
                        raise ValueError(f"{info.filename}: an .npy version this reader does not take")
                    shape, _, dtype = read(f)
                self.shapes[info.filename.removesuffix(".npy")] = (tuple(shape), np.dtype(dtype))
        for name, m in manifest["matrices"].items():
            if not isinstance(m, dict) or not isinstance(m.get("matched"), bool) or type(m.get("zero")) is not int:
                raise ValueError("a matrix's record is not as written")
            self.matrices[name] = Kept(m["matched"], m["zero"])

    def array(self, key: str) -> np.ndarray:
        with self.zip.open(key + ".npy") as f:
            return np.lib.format.read_array(f, allow_pickle=False)

    def close(self) -> None:
        self.zip.close()


def load(path: Path | None, ident: dict) -> Stored | None:
    """The archive kept for this model, open, or None where none of this identity can be read."""
    if path is None or not path.is_file():
        return None
    z = None
    try:
        z = zipfile.ZipFile(path)
        manifest = json.loads(z.read(MANIFEST))
        if manifest.get("identity") != ident or not isinstance(manifest.get("matrices"), dict):
            z.close()
            return None
        return Stored(z, manifest)
    except UNREADABLE:
        if z is not None:
            z.close()
        return None


class _Abandoned(Exception):
    """Ends atomic_path's block so that it removes the temporary file (an OSError would turn into BadInput)."""


class Writing:
    """A new archive written a matrix at a time into a temporary file beside its place (files.atomic_path), moved
    there when the block ends without error (with its manifest last), else removed. A write that fails (a full disk,
    a read-only folder) stops the writing and leaves `note` saying so; the run goes on."""
    def __init__(self, path: Path | None, ident: dict):
        self.path, self.ident, self.note = path, ident, None
        self.zip, self.place, self.matrices = None, contextlib.ExitStack(), {}

    def __enter__(self) -> "Writing":
        if self.path is not None:
            try:
                self.zip = zipfile.ZipFile(self.place.enter_context(atomic_path(self.path)), "w", allowZip64=True)
            except (BadInput, OSError) as e:
                self._fail(e)
        return self

    def keep(self, name: str, planes) -> None:
        """One matrix: its planes (None: it matched in no row order)."""
        if self.zip is None:
            return
        self.matrices[name] = Kept(planes is not None, 0 if planes is None else planes.zero)
        try:
            for part in PARTS if planes is not None else ():
                if (t := getattr(planes, part)) is not None:
                    with self.zip.open(f"{name}/{part}.npy", "w", force_zip64=True) as f:
                        np.lib.format.write_array(f, t.numpy(), allow_pickle=False)
        except OSError as e:
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        self.note = f"the repacked planes were not kept in {self.path} ({getattr(e, 'strerror', None) or e})"
        self._drop()

    def _drop(self) -> None:
        """Close the archive and remove its temporary file: atomic_path does, its block ending on an error."""
        if self.zip is not None:
            self.zip.close()
            self.zip = None
        self.place.__exit__(_Abandoned, _Abandoned(), None)

    def __exit__(self, kind, value, tb) -> None:
        if self.zip is None:
            return
        if kind is not None:
            self._drop()
            return
        try:
            self.zip.writestr(MANIFEST, json.dumps({"identity": self.ident,
                                                    "matrices": {n: asdict(k) for n, k in self.matrices.items()}}))
            self.zip.close()
            self.zip = None
            self.place.close()          # the temporary file moved into place
        except (BadInput, OSError) as e:
            self._fail(e)
