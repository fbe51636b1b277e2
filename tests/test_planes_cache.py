"""The repacked layout's planes kept on disk: the tiny model's layout installed, then installed again from the
archive with nothing repacked, the same planes and the same product; a changed model file, a damaged archive and an
archive of other shapes repacked and replaced; `off` keeps nothing."""
import os
import zipfile

import numpy as np
import pytest

from boltbeam.read.census import take_census
from boltbeam.route import layout, planes_cache

SETTING = layout.Setting("float16", "kernel", "separate")


@pytest.fixture
def model(tiny_model, tmp_path, monkeypatch):
    """A copy of the tiny model (its own path and modification time) and an empty planes folder."""
    path = tmp_path / "m.gguf"
    path.write_bytes(open(tiny_model, "rb").read())
    monkeypatch.setenv("BOLTBEAM_PLANES_CACHE", str(tmp_path / "planes"))
    return str(path)


def installed(path: str):
    """The model loaded and the layout installed: (the layers' planes as arrays, the Prepared, one product)."""
    from tinygrad import Tensor
    from tinygrad.llm.model import Transformer
    census = take_census(path)
    net, _ = Transformer.from_gguf(path, 8)
    done = layout.install(net, census, path, SETTING)
    layers = layout.layers(net, census)
    arrays = [[None if t is None else t.numpy() for t in (p.planes.low, p.planes.high, p.planes.scale, p.planes.offset)]
              + [p.planes.zero] for p in layers]
    x = Tensor(np.random.default_rng(3).standard_normal((1, 1, census.facts.embedding)).astype(np.float32))
    return arrays, done, net.blk[0].attn_q(x).numpy()


def same(a, b) -> bool:
    return all(len(p) == len(q) and all((u is None and v is None) or (u is not None and v is not None and np.array_equal(u, v))
                                        for u, v in zip(p[:-1], q[:-1])) and p[-1] == q[-1] for p, q in zip(a, b))


def repacks(monkeypatch) -> list:
    """Counts the weights layout.repack_all repacks from here on (install repacks a block's together)."""
    calls = []
    original = layout.repack_all
    monkeypatch.setattr(layout, "repack_all", lambda weights, *a, **k: calls.extend([1] * len(weights)) or
                        original(weights, *a, **k))
    return calls


def test_a_second_install_reads_the_planes_back_and_repacks_nothing(model, monkeypatch):
    first, done, product = installed(model)
    where = planes_cache.path_for(model, SETTING.scale_dtype)
    assert where.is_file() and not any("read back" in n for n in done.notes) and done.applied > 0
    calls = repacks(monkeypatch)
    again, done2, product2 = installed(model)
    assert calls == [] and any("read back" in n for n in done2.notes)
    assert same(first, again) and len(first) == done.applied == done2.applied
    assert np.array_equal(product, product2)
    # the model file changed (its modification time): repacked, and the archive replaced with its identity
    os.utime(model, ns=(os.stat(model).st_atime_ns, os.stat(model).st_mtime_ns + 10**9))
    third, done3, _ = installed(model)
    assert len(calls) == done.applied and same(first, third) and not any("read back" in n for n in done3.notes)
    calls.clear()
    installed(model)
    assert calls == []


@pytest.mark.parametrize("damage", ["cut", "shape", "altered"])
def test_an_archive_not_as_written_is_repacked_and_replaced(model, monkeypatch, damage):
    first, done, _ = installed(model)
    where = planes_cache.path_for(model, SETTING.scale_dtype)
    if damage == "cut":
        where.write_bytes(where.read_bytes()[:len(where.read_bytes()) // 2])
    elif damage == "altered":    # a byte of one matrix's values flipped: its header reads, its data fails the CRC
        data = bytearray(where.read_bytes())
        with zipfile.ZipFile(where) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("/low.npy"))
        name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
            int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
        data[info.header_offset + 30 + name_len + extra_len + 200] ^= 0xFF
        where.write_bytes(bytes(data))
    else:    # one matrix's scales of another shape, the rest as written
        with zipfile.ZipFile(where) as z:
            parts = {n: z.read(n) for n in z.namelist()}
        victim = next(n for n in parts if n.endswith("/scale.npy"))
        import io
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.zeros((3, 5), np.float16))
        parts[victim] = buf.getvalue()
        with zipfile.ZipFile(where, "w") as z:
            for n, data in parts.items():
                z.writestr(n, data)
    calls = repacks(monkeypatch)
    again, done2, _ = installed(model)
    assert len(calls) == done.applied and same(first, again)
    calls.clear()
    installed(model)        # replaced with a whole one
    assert calls == []


def test_off_keeps_nothing(model, tmp_path, monkeypatch):
    monkeypatch.setenv("BOLTBEAM_PLANES_CACHE", "off")
    assert planes_cache.path_for(model, "float16") is None
    installed(model)
    assert not (tmp_path / "planes").exists()


def test_a_write_that_fails_leaves_a_note_and_no_file(tmp_path):
    """A full disk mid-archive (an OSError from one matrix's arrays) or an error in the run's own block: no archive,
    no temporary file; only the first says so, and the run goes on."""
    import types

    class Array:
        def __init__(self, fails=False):
            self.fails = fails

        def numpy(self):
            if self.fails:
                raise OSError(28, "No space left on device")
            return np.zeros((2, 2), np.uint8)
    planes = lambda fails=False: types.SimpleNamespace(low=Array(fails), high=None, scale=Array(), offset=None, zero=0)
    with planes_cache.Writing(tmp_path / "full.npz", {}) as archive:
        archive.keep("a", planes())
        archive.keep("b", planes(fails=True))
        archive.keep("c", planes())
    assert "No space left on device" in archive.note
    with pytest.raises(KeyError):
        with planes_cache.Writing(tmp_path / "broken.npz", {}) as archive:
            archive.keep("a", planes())
            raise KeyError("the run's own error")
    assert archive.note is None and list(tmp_path.iterdir()) == []
    with planes_cache.Writing(tmp_path / "whole.npz", {"v": 1}) as archive:
        archive.keep("a", planes())
        archive.keep("b", None)
    stored = planes_cache.load(tmp_path / "whole.npz", {"v": 1})
    assert stored.matrices == {"a": planes_cache.Kept(True, 0), "b": planes_cache.Kept(False, 0)}
    assert stored.shapes == {"a/low": ((2, 2), np.dtype(np.uint8)), "a/scale": ((2, 2), np.dtype(np.uint8))}
    stored.close()
    assert [p.name for p in tmp_path.iterdir()] == ["whole.npz"]
