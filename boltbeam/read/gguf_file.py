"""Open a GGUF file with the `gguf` package's own reader, fast, and with clear errors.

GGUFReader walks every element of every metadata array in Python; a vocabulary of 150k strings
costs seconds. BoltBeam never needs the tokenizer's contents, so this subclass takes arrays of
numbers in one slice and steps over arrays of strings without building them. Everything else
(header, keys, tensor table, tensor views) is the package's own code. Tensor data is memory-mapped
and never read here.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from boltbeam.errors import BadInput


# No key, tensor name or metadata string of a real model comes near this (chat templates are tens of
# KB; tokenizer strings are stepped over, not read); a longer length is corruption, refused before
# its bytes are copied.
MAX_STRING = 1 << 20


class HeaderReader(GGUFReader):
    def _get_str(self, offset: int):
        (slen,) = struct.unpack_from("<Q", self.data, offset)
        if slen > MAX_STRING or offset + 8 + slen > len(self.data):
            raise ValueError(f"a string of {slen:,} bytes at byte {offset:,}")
        return super()._get_str(offset)

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        offs = orig_offs + 12
        itype, count = GGUFValueType(raw_itype[0]), int(alen[0])
        if itype == GGUFValueType.STRING:
            # Step over the strings by their length prefixes; keep the raw bytes as one part.
            buf = self.data
            for _ in range(count):
                (slen,) = struct.unpack_from("<Q", buf, offs)
                offs += 8 + slen
            if offs > len(buf):
                raise ValueError("string array runs past the end of the file")
            blob = self._get(orig_offs + 12, np.uint8, offs - orig_offs - 12)
            return offs - orig_offs, [raw_itype, alen, blob], [], [GGUFValueType.ARRAY, itype]
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is None:  # nested arrays: rare; let the package walk them
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(offs, nptype, count)
        if len(values) != count:
            raise ValueError("array runs past the end of the file")
        return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]


def open_gguf(path: str | os.PathLike) -> HeaderReader:
    """Open and validate the header and tensor table; every failure is one BadInput line."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"model {p}: no such file")
    size = p.stat().st_size
    if size < 24:
        raise BadInput(f"model {p}: not a GGUF file ({size} bytes)")
    with p.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise BadInput(f"model {p}: not a GGUF file (bad magic)")
    try:
        with np.errstate(over="ignore"):   # an offset that wraps 2^64 is refused below, not warned about
            reader = HeaderReader(p)
    except ValueError as e:
        msg = str(e)
        if "is not a valid GGMLQuantizationType" in msg:
            raise BadInput(f"model {p}: unknown quant type ({msg})") from None
        raise BadInput(f"model {p}: unreadable GGUF header ({msg})") from None
    except (IndexError, KeyError, struct.error, OverflowError) as e:
        raise BadInput(f"model {p}: truncated or corrupt GGUF header ({e.__class__.__name__}: {e})") from None
    _check_tensors(reader, p, size)
    return reader


def _check_tensors(reader: HeaderReader, p: Path, size: int) -> None:
    """The tensor table against the format's rules and the file's own size: at least one tensor, no
    empty dimension, each tensor's data aligned inside the data section, none overlapping another."""
    if not reader.tensors:
        raise BadInput(f"model {p}: the file holds no tensors: nothing to read or bound")
    end = reader.data_offset
    for t in sorted(reader.tensors, key=lambda t: int(t.data_offset)):
        dims = [int(d) for d in t.shape]
        if not dims or min(dims) < 1:
            raise BadInput(f"model {p}: tensor {t.name} has an empty dimension {dims}")
        start, stop = int(t.data_offset), int(t.data_offset) + int(t.n_bytes)
        if (start - reader.data_offset) % reader.alignment:
            raise BadInput(f"model {p}: tensor {t.name}'s data at byte {start:,} breaks the file's "
                           f"{reader.alignment}-byte alignment")
        if start < end:
            what = "the header" if end == reader.data_offset else "the tensor before it"
            raise BadInput(f"model {p}: tensor {t.name}'s data at byte {start:,} overlaps {what} (ends at {end:,})")
        if stop > size:
            raise BadInput(f"model {p}: truncated: tensor {t.name} ends at byte {stop:,} of a {size:,}-byte file")
        end = stop


def scalar(reader: GGUFReader, key: str) -> Any:
    """A metadata value as a Python scalar (or string), or None if absent or not a scalar."""
    f = reader.get_field(key)
    if f is None or not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        if len(f.types) > 1 and f.types[1] != GGUFValueType.STRING and f.data:
            return [v.item() for v in f.parts[f.data[0]]]
        return None
    try:
        return f.contents()
    except UnicodeDecodeError:
        raise BadInput(f"metadata {key}: a string that is not UTF-8") from None


def strings(reader: HeaderReader, key: str) -> list[str] | None:
    """A metadata array of strings (a tokenizer's vocabulary), decoded from the one blob HeaderReader keeps
    of it; None if absent or not an array of strings."""
    f = reader.get_field(key)
    if f is None or f.types[:2] != [GGUFValueType.ARRAY, GGUFValueType.STRING]:
        return None
    blob, out, offs = f.parts[-1].tobytes(), [], 0
    try:
        while offs < len(blob):
            (n,) = struct.unpack_from("<Q", blob, offs)
            out.append(blob[offs + 8:offs + 8 + n].decode())
            offs += 8 + n
    except UnicodeDecodeError:
        raise BadInput(f"metadata {key}: a string that is not UTF-8") from None
    return out

