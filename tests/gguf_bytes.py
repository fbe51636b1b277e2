"""GGUF files byte by byte, for tests that need headers no writer would produce."""
from __future__ import annotations

import struct

STRING, UINT32 = 8, 4
ALIGN = 32


def _str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def gguf(tensors: list[tuple[bytes, list[int], int, int]], kv: list[tuple[bytes, int, bytes]] = (),
         data_bytes: int = 4096, name_length: int | None = None) -> bytes:
    """tensors: (name, dims, ggml type, offset into the data section); kv: (key, value type, packed value)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, vtype, value in kv:
        out += _str(key) + struct.pack("<I", vtype) + value
    for name, dims, ggml_type, offset in tensors:
        n = struct.pack("<Q", name_length) + name if name_length is not None else _str(name)
        out += n + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % ALIGN)
    return out + bytes(range(256)) * (data_bytes // 256)


def arch_kv(arch: bytes = b"llama") -> list[tuple[bytes, int, bytes]]:
    return [(b"general.architecture", STRING, _str(arch))]


def string_kv(key: bytes, raw: bytes) -> tuple[bytes, int, bytes]:
    return key, STRING, _str(raw)
