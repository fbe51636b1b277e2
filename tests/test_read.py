"""The census: roles from GGUF's naming conventions, bytes per token, bad input."""
import json
import struct

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

import gguf_bytes
from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.read.census import take_census
from boltbeam.synth.writer import plan, shape_from


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_smollm2_roles_all_classified_and_tied(smollm2, capsys):
    d = run_json(capsys, "inspect", smollm2)
    assert d["architecture"] == "llama"
    assert d["unclassified"] == [] and d["status"] == "complete"
    assert d["tied_embeddings"] is True
    embd = next(t for t in d["tensors"] if t["name"] == "token_embd.weight" and t["role"] == "token_embd")
    # The lookup reads one row; the tied output projection reads the whole table, counted once.
    assert embd["bytes_per_token"] == embd["bytes"] // embd["shape"][1]
    assert d["roles"]["output"] == {"count": 1, "bytes": 0, "bytes_per_token": embd["bytes"]}
    assert sum(t["bytes_per_token"] for t in d["tensors"]) == d["bytes_per_token"]
    assert d["bytes_per_token"] == sum(t["bytes"] for t in d["tensors"] if not t["tied"]) - embd["bytes"] \
        + embd["bytes_per_token"] + embd["bytes"]
    assert {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "attn_norm",
            "ffn_norm", "output_norm", "token_embd", "output"} == set(d["roles"])
    assert any("tied" in n for n in d["notes"])


def test_default_model_is_used_without_argument(capsys):
    d = run_json(capsys, "inspect")
    assert d["path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_formats_come_from_the_file(tiny_model):
    c = take_census(tiny_model)
    q4k = c.formats["Q4_K"]
    assert (q4k.block_elements, q4k.block_bytes) == GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K]
    assert q4k.bits_per_weight == pytest.approx(4.5)
    assert c.formats["Q6_K"].bits_per_weight == pytest.approx(6.5625)
    # The q4_k_m rule puts ffn_down of the last block in Q6_K, the first block's in Q4_K.
    fmt = {t.name: t.format for t in c.tensors}
    assert fmt["blk.1.ffn_down.weight"] == "Q6_K" and fmt["blk.0.ffn_down.weight"] == "Q4_K"
    assert fmt["output.weight"] == "Q6_K" and fmt["blk.0.attn_norm.weight"] == "F32"


def test_8b_mix_matches_the_anchor_numbers():
    planned = plan("qwen3", shape_from("8b"), "q4_k_m")
    assert sum(p.nbytes for p in planned) == 5_021_827_072
    tables = [p for p in planned if p.ne1 and not p.name.startswith("token_embd")]
    assert len(tables) == 253
    assert sum(p.nbytes for p in tables) == 4_670_533_632
    assert next(p for p in planned if p.name == "output.weight").nbytes == 510_504_960


def test_synth_blocks_are_valid_and_never_zero(tiny_model):
    import numpy as np
    from gguf import GGUFReader
    r = GGUFReader(tiny_model)
    for t in r.tensors:
        raw = np.asarray(t.data).view(np.uint8)
        assert raw.any(), t.name
        if t.tensor_type == GGMLQuantizationType.Q4_K:
            blocks = raw.reshape(-1, 144)
            d = blocks[:, 0:2].copy().view(np.float16)
            assert np.isfinite(d).all() and (d > 0).all()


def test_unclassified_tensor_is_listed_and_strict_refuses(tmp_path, capsys):
    from gguf import GGUFWriter
    import numpy as np
    path = tmp_path / "odd.gguf"
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.ones((8, 32), np.float32))
    w.add_tensor("blk.0.mystery_proj.weight", np.ones((8, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    d = run_json(capsys, "inspect", str(path))
    assert d["unclassified"] == ["blk.0.mystery_proj.weight"]
    assert d["status"] == "adapter-incomplete"
    assert main(["inspect", str(path), "--strict"]) == 3
    assert "mystery_proj" in capsys.readouterr().err


@pytest.mark.parametrize("make,message", [
    (lambda p: None, "no such file"),
    (lambda p: p.write_text("this is not a model\n" * 10), "not a GGUF file"),
    (lambda p: p.write_bytes(b""), "not a GGUF file"),
])
def test_bad_files_give_one_line_and_exit_2(tmp_path, capsys, make, message):
    path = tmp_path / "bad.gguf"
    make(path)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_truncated_gguf(tiny_model, tmp_path, capsys):
    data = open(tiny_model, "rb").read()
    for cut, why in ((len(data) - 1000, "truncated"), (300, "")):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        assert main(["inspect", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("boltbeam: error: model") and why in err and err.count("\n") == 1


def test_unknown_quant_type(tiny_model, tmp_path, capsys):
    from boltbeam.read.gguf_file import open_gguf
    r = open_gguf(tiny_model)
    # Patch the first tensor's ggml type (a uint32 after its name and dims) to a number no format has.
    field = r.tensors[0].field
    type_offset = field.offset + sum(int(p.nbytes) for p in field.parts[:4])
    data = bytearray(open(tiny_model, "rb").read())
    data[type_offset:type_offset + 4] = struct.pack("<I", 250)
    path = tmp_path / "unknown.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(BadInput, match="unknown quant type"):
        take_census(path)
    assert main(["inspect", str(path)]) == 2


def test_synth_bad_input_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x.gguf"
    assert main(["synth", str(out), "--arch", "qwen3", "--preset", "nonesuch"]) == 2
    assert main(["synth", str(out), "--arch", "no-such-arch", "--preset", "tiny"]) == 2
    assert main(["synth", str(out), "--arch", "qwen3", "--preset", "tiny", "--embedding", "100"]) == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert main(["synth", str(out), "--arch", "llama", "--preset", "tiny", "--tied"]) == 0
    c = take_census(out)
    assert c.tied_embeddings and not c.unclassified


F32 = 0   # GGML type: 4 bytes an element


@pytest.mark.parametrize("blob, says", [
    (gguf_bytes.gguf([], gguf_bytes.arch_kv()), "holds no tensors"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64, 0], F32, 0)], gguf_bytes.arch_kv()), "empty dimension"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 4)], gguf_bytes.arch_kv()), "alignment"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 0), (b"token_embd.weight", [64, 4], F32, 128)],
                     gguf_bytes.arch_kv()), "overlaps the tensor before it"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 2 ** 64 - 32)], gguf_bytes.arch_kv()),
     "overlaps the header"),                                                        # an offset that wraps 2^64
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 2 ** 40)], gguf_bytes.arch_kv()), "cannot reshape"),
    (gguf_bytes.gguf([(b"output_norm.weight", [2 ** 62, 2 ** 62], F32, 0)], gguf_bytes.arch_kv()), "cannot reshape"),
    (gguf_bytes.gguf([(b"blk.0.ffn_down.weight", [100, 4], 12, 0)], gguf_bytes.arch_kv()),
     "not a multiple of Q4_K block size"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 0)], gguf_bytes.arch_kv(), name_length=3 << 30),
     "a string of 3,221,225,472 bytes"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 0)],
                     [gguf_bytes.string_kv(b"general.architecture", b"\xff\xfe")]), "not UTF-8"),
    (gguf_bytes.gguf([(b"output_norm.weight", [64], F32, 0), (b"token_embd.weight", [64, 4], F32, 256)],
                     gguf_bytes.arch_kv() + [(b"llama.block_count", gguf_bytes.UINT32, struct.pack("<I", 1))]),
     "the metadata says 1 block(s); the tensor table holds no block's tensors"),
    (gguf_bytes.gguf([(b"blk.0.attn_norm.weight", [64], F32, 0), (b"blk.3.attn_norm.weight", [64], F32, 256),
                      (b"output_norm.weight", [64], F32, 512)],
                     gguf_bytes.arch_kv() + [(b"llama.block_count", gguf_bytes.UINT32, struct.pack("<I", 2))]),
     "holds blocks 0 to 3 (2 of them)"),
    (gguf_bytes.gguf([(b"blk.0.attn_norm.weight", [64], F32, 0)],                   # checked before any list of
                     gguf_bytes.arch_kv() + [(b"llama.block_count", gguf_bytes.UINT32, struct.pack("<I", 2 ** 31))]),
     "says 2147483648 blocks for 1 tensors"),                                        # blocks is made from it
])
@pytest.mark.parametrize("command", [["inspect"], ["bound", "--target", "h200"]])
def test_corrupt_headers_are_one_line(tmp_path, capsys, blob, says, command):
    path = tmp_path / "m.gguf"
    path.write_bytes(blob)
    assert main([command[0], str(path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
