"""`audit --reference`: the route's greedy tokens held to llama.cpp's on the trace's own prompt ids (the stand-in
binding, whose greedy token is always 3), the page and the summary naming the reference; --strict exits 3 where a
step differs; without the binding one line before anything is written."""
import json

from boltbeam.cli import main
from boltbeam.measure.trace import load
from tests.test_hostile3 import one_line
from tests.test_llama import with_fakes


def audit_args(model, trace, out, *extra):
    return ["audit", model, "--trace", str(trace), "--target", "host", "--reference", "--json", "--out", str(out), *extra]


def test_audit_reference_says_which_reference_and_where_the_tokens_differ(tiny_model, tiny_default, tmp_path,
                                                                          monkeypatch, capsys):
    ours = load(tiny_default.path).output_tokens
    differ = [i for i, t in enumerate(ours) if t != 3]
    assert differ                                         # the tiny model's tokens are not the stand-in's
    with_fakes(monkeypatch)
    out = tmp_path / "audit"
    assert main(audit_args(tiny_model, tiny_default.path, out)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"].startswith("fail: checked against reference engine llama.cpp")
    assert f"the first at step {differ[0]}: {ours[differ[0]]} where" in summary["output"]
    held = json.loads((out / "audit.json").read_text())["output_reference"]
    assert held["status"] == "fail" and "llama.cpp" in held["engine"] and "--reference" in held["path"]
    assert f"checked against reference engine {held['engine']}" in (out / "report.html").read_text()
    one_line(capsys, 3, main(audit_args(tiny_model, tiny_default.path, tmp_path / "strict", "--strict")),
             "the output is not the reference's")


def test_audit_reference_without_the_binding_is_one_line(tiny_model, tiny_default, tmp_path, capsys):
    out = tmp_path / "audit"
    one_line(capsys, 2, main(audit_args(tiny_model, tiny_default.path, out)), "needs llama-cpp-python")
    assert not out.exists()
