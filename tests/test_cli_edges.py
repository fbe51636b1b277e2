"""The target and the model a trace recorded are found without flags; where they cannot be, one line says so."""
import json
import platform
from pathlib import Path

import pytest

from boltbeam.bound.targets import HOST, get_target, host_cache_path, target_of
from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.measure.trace import Environment, Kernel, Provenance, RouteRecord, Trace, Workload, save

HOST_TOML = """[host]
description = "this machine (test)"
memory_bandwidth = { value = 2e10, unit = "B/s", status = "measured", source = "test", date = "2026-12-04" }
"""


def cached_host(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host_cache_path().parent.mkdir()
    host_cache_path().write_text(HOST_TOML)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def trace_file(tmp_path, model: str, **environment) -> str:
    ks = [Kernel(token=0, index=i, name=f"k{i}", duration_us=40.0, start_us=50.0 * i, category="other")
          for i in range(2)]
    t = Trace(Environment(engine="tinygrad", model_path=model, **environment), Workload(context=0, batch=1),
              RouteRecord("test"), token_wall_us=[100.0, 101.0], provenance=Provenance("profile"), kernels=ks)
    path = tmp_path / "t.json"
    save(t, path)
    return str(path)


def test_the_chip_a_trace_names_is_its_target(tmp_path, monkeypatch):
    assert target_of("NVIDIA H200").name == "h200"
    assert target_of("NVIDIA H200, 580.159.04").name == "h200"   # llama.cpp adds the driver
    with pytest.raises(BadInput, match="no target declares.*pass --target"):
        target_of("NVIDIA H200 NVL")                            # another product: never a guess
    cached_host(tmp_path, monkeypatch)
    assert target_of(None, "CPU", platform.node()).name == HOST
    with pytest.raises(BadInput, match="pass --target"):
        target_of(None, "CPU", platform.node() + "-elsewhere")


def test_unknown_target_lists_each_name_once(tmp_path, monkeypatch):
    cached_host(tmp_path, monkeypatch)
    with pytest.raises(BadInput) as e:
        get_target("no-such-chip")
    known = str(e.value).split("known: ")[1].split(", ")
    assert HOST in known and len(known) == len(set(known))


def test_account_and_compare_find_target_and_model(capsys, tmp_path, tiny_model):
    path = trace_file(tmp_path, tiny_model, device="CUDA", device_name="NVIDIA H200")
    found = run(capsys, "account", path, "--json")
    assert found == run(capsys, "account", path, "--model", tiny_model, "--target", "h200", "--json")
    assert found[0] in (0, 3) and found[1]
    floors = run(capsys, "compare", path, path, "--target", "h200", "--json")
    assert floors[0] == 0 and floors == run(capsys, "compare", path, path, "--target", "h200", "--model", tiny_model,
                                            "--json")
    assert any(r["floor_us"] for r in json.loads(floors[1])["regions"])
    bare = json.loads(run(capsys, "compare", path, path, "--json")[1])                # no flag: no floors
    assert all(r["floor_us"] is None for r in bare["regions"])


def test_a_trace_from_an_undeclared_chip_asks_for_target(capsys, tmp_path, tiny_model):
    path = trace_file(tmp_path, tiny_model, device="CUDA", device_name="Some Future GPU")
    for argv in (["account", path], ["report", path, "--out", tmp_path / "r.html"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and "pass --target" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_synth_help_lists_the_presets(capsys):
    from boltbeam.synth.shapes import presets
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(f"{name} ({s.blocks} blocks" in shown for name, s in presets().items())


def test_targets_print_counts_as_digits_and_names_whole(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "65,536" in out and "6.554e+04" not in out                     # registers_per_multiprocessor
    assert "max_threads_per_multiprocessor" in out                        # the longest fact name, unbroken


def test_the_host_declares_what_a_cpu_search_needs():
    """`host` as measured: its vector registers and cores, no thread groups; BubbleBeam then keeps the CPU's
    space (upcasts and unrolls that fit the registers), where before it refused every setting."""
    from boltbeam.bound.measure_target import cpu_facts, target_toml
    from boltbeam.bound.targets import _load_file
    from boltbeam.foresight.space import KernelShape, propose, searchable
    measured = {"device": "CPU", "size_bytes": 1 << 28, "read_bandwidth": 2e10, "read_samples_s": [0.01] * 3,
                "copy_bandwidth": 1.5e10, "copy_samples_s": [0.02] * 3}
    host = _load_file(target_toml(HOST, "test", measured) + cpu_facts(), "test")[HOST]
    assert host.fact("max_threads_per_group") is None and host.fact("multiprocessors") >= 1
    space = propose(KernelShape("k0", "r_256_1024", output=256, reduce=1024, outputs=256, output_axis=0),
                    searchable("tinygrad_opts"), host)
    assert space.legal and all(s["local"] == 1 and s["group"] == 1 for s in space.legal)
    assert any(s["upcast"] > 1 or s["unroll"] > 1 for s in space.legal)
    assert all(s["upcast"] * s["unroll"] * 2 <= host.fact("registers_per_thread") for s in space.legal)


def test_an_account_with_any_refusal_is_not_called_closed(tmp_path, capsys):
    """A residual inside 1% with the kernels inflated by their timing is still a refused account: the
    summary and the page say refused, as `account` exits 3 for it."""
    from types import SimpleNamespace

    from boltbeam.cli.audit import _summarize
    page = tmp_path / "report.html"
    page.write_text("x")
    acc = SimpleNamespace(closed=True, refusals=["per-kernel timing inflated the kernels"])
    audit = SimpleNamespace(account=acc, returns=None, no_account=None, wall_us=100.0, unread=None, output=None, trace_path="t",
                            bound=SimpleNamespace(token_floor_us=10.0, ceiling_tok_s=1e5))
    assert _summarize(audit, page, 0.0, SimpleNamespace(json=True, strict=False)) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["account"] == "refused" and "inflated" in said["why"]
    template = (Path(__file__).parent.parent / "boltbeam/report/templates/audit.html.j2").read_text()
    assert "{% elif not account.refusals %}<span class=\"closed\">closed" in template
