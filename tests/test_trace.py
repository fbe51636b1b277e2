"""The trace format: every field a reader relies on is checked when a trace is loaded, so bad
input ends in one line and exit 2 in every command that reads traces."""
import json
from pathlib import Path

import pytest

from boltbeam.cli import main
from boltbeam.measure.trace import FORMAT, VERSION, KernelPass, load

ROOT = Path(__file__).resolve().parents[1]


def good() -> dict:
    return {"format": FORMAT, "version": VERSION, "environment": {"engine": "test"}, "workload": {"context": 4},
            "route": {"label": "r"}, "provenance": {"source": "test"}, "token_wall_us": [100.0, 101.0],
            "kernel_pass_wall_us": [110.0], "output_tokens": [1, 2],
            "memory": {"peak_bytes": 10, "capacity_bytes": 100},
            "kernels": [{"token": 0, "index": 0, "name": "k", "duration_us": 50.0, "start_us": 0.0,
                         "role": None, "category": "other", "tensors": [], "bytes": 10, "flops": 0,
                         "global_size": [32], "local_size": [32], "opts": []}]}


def kernel_field(key, value):
    d = good()
    d["kernels"][0][key] = value
    return d


def top(path, value):
    d = good()
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


BAD = [
    (kernel_field("token", "a"), "'token' must be"),
    (kernel_field("start_us", "x"), "'start_us' must be"),
    (kernel_field("role", ["x"]), "'role' must be"),
    (kernel_field("bytes", "x"), "'bytes' must be"),
    (kernel_field("global_size", "ab"), "'global_size' must be"),
    (kernel_field("category", "magic"), "'category' must be"),
    (kernel_field("launch", -1), "'launch' must be"),
    (kernel_field("launch", 1.5), "'launch' must be"),
    (kernel_field("nonsense", 1), "unexpected keyword"),
    (top(["workload", "context"], "x"), "workload 'context'"),
    (top(["environment", "model_sha256"], 12345), "'model_sha256'"),
    (top(["memory", "peak_bytes"], "lots"), "memory 'peak_bytes'"),
    (top(["memory", "capacity_bytes"], 0), "memory 'capacity_bytes' must be a byte count > 0"),   # judge divided by it
    (top(["token_wall_us"], [0.0, 5.0]), "'token_wall_us'"),
    (top(["kernels"], {"a": 1}), "'kernels' must be a list"),
    (top(["route", "label"], 3), "route 'label'"),
    (top(["environment", "gpu"], "x"), "unexpected keyword argument 'gpu'"),     # a key no field names
    (top(["provenance", "reference"], 3), "'reference' must be an object"),
    (top(["provenance", "phases"], {"setup_s": 1}), "provenance 'phases'"),
    (top(["provenance", "phases"], dict.fromkeys(["setup_s", "load_s", "families_s", "prefill_s", "warmup_s"], 1.0)
         | {"tokens_s": -2.0}), "'phases' must be seconds >= 0"),
    (top(["kernel_pass"], {"timing": "stopwatch", "jit_calls": [1], "graph_launches": [2]}), "'kernel_pass' must be"),
    (top(["kernel_pass"], {"timing": "cupti", "jit_calls": [1]}), "'kernel_pass' must be"),
    (top(["kernel_pass"], {"timing": "cupti", "jit_calls": [-1], "graph_launches": [2]}), "'kernel_pass' must be"),
    (top(["kernel_pass"], {"timing": "cupti", "jit_calls": [1], "graph_launches": [2], "lead_us": ["x"]}),
     "'kernel_pass' must be"),
    (top(["kernel_pass"], {"timing": "cupti", "jit_calls": [1], "graph_launches": [2], "extra": 1}),
     "'kernel_pass' must be"),
    (top(["kernel_pass"], {"timing": "cupti", "jit_calls": [1], "graph_launches": [2], "timed_bracket_us": 7.0}),
     "'kernel_pass' must be"),
]


@pytest.mark.parametrize("doc,message", BAD)
def test_bad_traces_give_one_line_in_every_reader(tmp_path, capsys, doc, message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "chrome.json"
    for argv in (["account", str(path), "--target", "h200", "--model", "x.gguf"], ["compare", str(path), str(path)],
                 ["export-trace", str(path), "--chrome", str(out)],
                 ["judge", "--baseline", str(path), "--candidate", str(path)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert not out.exists()


def test_a_good_trace_loads(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(good()))
    assert main(["compare", str(path), str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["net_us"] == 0
    with_pass = top(["kernel_pass"], {"timing": "hcq", "jit_calls": [1], "graph_launches": [2], "lead_us": [3.5],
                                      "trail_us": [1.0]})
    path.write_text(json.dumps(with_pass))
    assert load(str(path)).kernel_pass == KernelPass("hcq", [1], [2], [3.5], [1.0])
    bracketed = top(["kernel_pass"], {"timing": "cupti", "jit_calls": [1], "graph_launches": [2],
                                      "plain_bracket_us": [900.0], "timed_bracket_us": [925.5]})
    path.write_text(json.dumps(bracketed))
    assert load(str(path)).timing_cost_us() == [25.5]


@pytest.mark.parametrize("path", ["bench/h200/runs/tinygrad_default.json.gz",      # tinygrad, before notes
                                  "bench/h200/search/run4/candidate.json.gz",
                                  "bench/h200/models/SmolLM2-135M.llama.json.gz",   # llama.cpp
                                  "bench/h200/runs/llama_bench_d512.trace.json"])   # llama-bench, imported
def test_a_stored_trace_saves_again_with_the_objects_it_had(path):
    from boltbeam.files import load_json
    from boltbeam.measure.trace import RECORDS
    doc = load_json(ROOT / path, "trace")
    again = load(str(ROOT / path)).to_dict()
    assert {key: again[key] for key in RECORDS} == {key: doc[key] for key in RECORDS}


def test_account_needs_the_model_it_ran(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(top(["environment", "model_path"], str(tmp_path / "gone.gguf"))))
    assert main(["account", str(path), "--target", "h200"]) == 2
    assert "pass --model" in capsys.readouterr().err


def test_writing_onto_a_folder_is_bad_input(tmp_path, capsys):
    assert main(["synth", str(tmp_path), "--arch", "qwen3", "--preset", "tiny"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, says", [
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    (json.dumps(good()).replace("100.0", "NaN", 1), "NaN is not a number JSON allows"),
    (json.dumps(good()).replace("100.0", "Infinity", 1), "Infinity is not a number JSON allows"),
])
def test_hostile_json_is_one_line(tmp_path, capsys, text, says):
    path = tmp_path / "t.json"
    path.write_text(text)
    for argv in (["compare", str(path), str(path)], ["export-trace", str(path), "--chrome", str(tmp_path / "c.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "c.json").exists()


def test_gzipped_traces_read_as_they_are(tmp_path, capsys, monkeypatch):
    """Big traces are kept gzipped; a cut one, or one that unpacks past the limit, is one line."""
    import gzip

    from boltbeam import files
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(json.dumps(good()))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load(str(packed)) == load(str(plain))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed.read_bytes()[:-12])
    monkeypatch.setattr(files, "MAX_UNPACKED", len(plain.read_bytes()) - 1)
    for path, says in ((cut, "not valid JSON"), (packed, "unpacks to more than")):
        assert main(["compare", str(path), str(plain)]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_special_files_are_never_replaced(tmp_path, capsys):
    import os
    import stat
    path = tmp_path / "t.json"
    path.write_text(json.dumps(good()))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    targets = [fifo]
    node = tmp_path / "full"   # a character device like /dev/full, made here, never one under /dev
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        targets.append(node)
    except PermissionError:     # not root, or a sandbox without device nodes: the pipe and the link remain
        pass
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    for out in [*targets, link]:
        assert main(["export-trace", str(path), "--chrome", str(out)]) == 2
        assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and link.is_symlink() and not (tmp_path / "elsewhere.json").exists()
    if len(targets) > 1:
        assert stat.S_ISCHR(targets[1].lstat().st_mode)


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    import errno
    import os
    path = tmp_path / "t.json"
    path.write_text(json.dumps(good()))

    def full(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "replace", full)
    assert main(["export-trace", str(path), "--chrome", str(tmp_path / "c.json")]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
