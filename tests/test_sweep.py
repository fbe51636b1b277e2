"""`boltbeam sweep`: a trace a depth, tokens/s and regions by depth, a page with another sweep beside it; bad
depths refused in one line before anything runs."""
import json
import statistics

import pytest

from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.account import sweep as sweeps
from boltbeam.measure import trace as tracefile
from boltbeam.report.page import render_sweep


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("text", ["0", "-1", "4,-8", "a", "4,,8", "²", "4,4", "1e3", ",".join(["4"] * 17)])
def test_bad_depths(text):
    with pytest.raises(BadInput, match="--contexts"):
        sweeps.parse_contexts(text)


def test_depths_in_order():
    assert sweeps.parse_contexts("4096, 512,16384") == [512, 4096, 16384]


@pytest.mark.parametrize("contexts, says", [("0", "at least 1"), ("8,100000", "past"), ("x", "whole numbers")])
def test_bad_depths_write_nothing(capsys, tmp_path, tiny_model, contexts, says):
    code, out, err = run(capsys, "sweep", tiny_model, "--device", "CPU", "--contexts", contexts, "--out", tmp_path / "s")
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


def test_a_sweep_on_cpu(capsys, tmp_path, tiny_model):
    out = tmp_path / "s"
    code, printed, err = run(capsys, "sweep", tiny_model, "--device", "CPU", "--contexts", "8,2", "--tokens", "1",
                             "--constants-once", "--out", out, "--json")
    assert code == 0, err
    doc = json.loads(printed)
    assert sorted(p.name for p in out.iterdir()) == ["sweep.html", "sweep.json", "trace_2.json", "trace_8.json"]
    assert json.loads((out / "sweep.json").read_text()) == doc
    assert [d["context"] for d in doc["depths"]] == [2, 8]
    for d in doc["depths"]:
        trace = tracefile.load(d["trace"])
        assert trace.workload.context == d["context"] and "constants-once" in d["route"]   # the flag reached it
        assert d["wall_us"] == statistics.median(trace.token_wall_us)
        assert d["regions_us"]["attention"] > 0 and doc["tok_s"][str(d["context"])] == pytest.approx(1e6 / d["wall_us"])
    html = (out / "sweep.html").read_text()
    assert html.count("<svg") == 1 and "depth 8" in html and "trace_8.json" in html
    # read back (as --compare reads another sweep) and drawn beside itself under another name: a line each
    this = sweeps.load(str(out / "sweep.json"))
    assert this.depths == [sweeps.Depth(**d) for d in doc["depths"]]
    both = render_sweep([("A", this), ("B", this)])
    assert both.count("<svg") == 1 and both.count("µs a token by region") == 2 and ">B<" in both


def test_a_malformed_sweep_is_one_line(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"format": "boltbeam-sweep", "version": 1, "model": "m", "device": "CPU",
                                "engine": "tinygrad", "depths": [{"context": 4, "trace": "t", "route": "r",
                                                                  "wall_us": 0, "regions_us": {}}]}))
    with pytest.raises(BadInput, match="not a positive number"):
        sweeps.load(str(path))
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(BadInput, match="not a BoltBeam sweep"):
        sweeps.load(str(path))


def test_a_refusal_after_the_trace_stays_beside_its_numbers(tmp_path, monkeypatch):
    """A profile that wrote its trace and then refused (a tensor never read) keeps its depth, refusal said;
    one that wrote nothing stops the sweep with its reason."""
    from boltbeam.errors import Refused
    from boltbeam.measure import tinygrad_run

    def profiled(model, device, out, *flags):
        context = int(flags[flags.index("--context") + 1])
        if context == 99:
            return "Killed"
        tracefile.save(tracefile.Trace(tracefile.Environment(engine="tinygrad"), tracefile.Workload(context=context),
                                       tracefile.RouteRecord("r"), token_wall_us=[100.0, 300.0],
                                       provenance=tracefile.Provenance()), out)
        return "boltbeam: refused: adapter-incomplete: 1 of the file's tensors was never read"
    monkeypatch.setattr(tinygrad_run, "profile_elsewhere", profiled)
    done = sweeps.sweep("m.gguf", "CPU", [4, 8], tmp_path, [])
    assert [(d.context, d.wall_us, d.regions_us) for d in done.depths] == [(4, 200.0, {}), (8, 200.0, {})]
    assert all("never read" in d.refusal for d in done.depths)
    assert "never read" in render_sweep([("A", done)])
    with pytest.raises(Refused, match="depth 99 did not finish: Killed"):
        sweeps.sweep("m.gguf", "CPU", [99], tmp_path, [])


def test_a_compared_sweep_is_never_overwritten(capsys, tmp_path, tiny_model):
    out = tmp_path / "s"
    out.mkdir()
    (out / "sweep.json").write_text("{}")
    code, _, err = run(capsys, "sweep", tiny_model, "--device", "CPU", "--contexts", "4", "--out", out,
                       "--compare", out / "sweep.json")
    assert code == 2 and "sweep.json" in err and (out / "sweep.json").read_text() == "{}"


def test_a_bad_route_or_family_is_one_line_before_any_profile(capsys, tmp_path, tiny_model):
    for flags, says in ((["--route", tmp_path / "nope.json"], "nope.json"), (["--layout", "float16:sideways"], "layout")):
        code, out, err = run(capsys, "sweep", tiny_model, "--device", "CPU", "--contexts", "4", "--out", tmp_path / "s",
                             *flags)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


def test_a_child_s_bad_input_stays_bad_input(tmp_path, monkeypatch):
    from boltbeam.measure import tinygrad_run
    monkeypatch.setattr(tinygrad_run, "profile_elsewhere", lambda *a: "boltbeam: error: --tokens must be 1 or more")
    with pytest.raises(BadInput, match="depth 4: --tokens must be 1 or more"):
        sweeps.sweep("m.gguf", "CPU", [4], tmp_path, [])


@pytest.mark.parametrize("depth, says", [({"context": True}, "a depth of True"), ({"context": 0}, "a depth of 0"),
                                         ({"regions_us": {"qkv": "x"}}, "not a positive number")])
def test_a_sweep_s_numbers_are_checked(tmp_path, depth, says):
    path = tmp_path / "sweep.json"
    good = {"context": 4, "trace": "t", "route": "r", "wall_us": 10.0, "regions_us": {}}
    path.write_text(json.dumps({"format": "boltbeam-sweep", "version": 1, "model": "m", "device": "CPU",
                                "engine": "tinygrad", "depths": [{**good, **depth}]}))
    with pytest.raises(BadInput, match=says):
        sweeps.load(str(path))
