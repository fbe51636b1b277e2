"""Floors by physics: the seed article's own arithmetic, KV and windows from file facts, targets as data."""
import json

import pytest

from boltbeam.bound.roofline import bound
from boltbeam.bound.targets import get_target, registry
from boltbeam.cli import main
from boltbeam.read.census import Census, ModelFacts, TensorEntry
from boltbeam.synth.writer import plan, shape_from


def census_of_plan(arch: str, preset: str, mix: str = "q4_k_m", **facts) -> Census:
    """The census a file of this plan would have, without writing gigabytes (tensor table only)."""
    from boltbeam.read.census import Format
    from boltbeam.read.roles import arch_of, classify
    s = shape_from(preset)
    tensors, formats = [], {}
    for p in plan(arch, s, mix):
        role, block = classify(p.name, arch_of(arch))
        shape = [p.ne0] if not p.ne1 else [p.ne0, p.ne1]
        bpt = p.nbytes // p.ne1 if role == "token_embd" else p.nbytes
        tensors.append(TensorEntry(p.name, role, p.qtype.name, shape, p.nbytes, bpt, block))
        formats[p.qtype.name] = Format.of(int(p.qtype))
    f = ModelFacts(blocks=s.blocks, embedding=s.embedding, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                   value_dim=s.head_dim, vocabulary=s.vocabulary, context_length=s.context_length, **facts)
    return Census("plan", arch, {}, f, tensors, formats, [], False, [], sum(t.bytes for t in tensors))


def test_8b_on_rtx5090_is_the_seed_articles_arithmetic():
    c = census_of_plan("qwen3", "8b")
    weights = sum(t.bytes_per_token for t in c.tensors if t.role not in ("token_embd",) and t.format != "F32")
    assert weights == 4_670_533_632
    # bytes per token: the 253 tables plus norms, the embedding row and the KV cache at 512
    b = bound(c, get_target("rtx5090"), context=512)
    kv = 36 * 512 * 8 * (128 + 128) * 2
    assert b.role("kv_cache").bytes == kv + 36 * 8 * 256 * 2
    expected = 4_670_533_632 + sum(t.bytes for t in c.tensors if t.format == "F32") + kv
    assert abs(sum(r.bytes for r in b.roles if r.role != "activations") - expected) / expected < 0.002
    b0 = bound(c, get_target("rtx5090"), context=0)
    assert b0.token_floor_us == pytest.approx(2750, rel=0.01)
    assert b0.ceiling_tok_s == pytest.approx(364, rel=0.01)
    assert b0.role("output").floor_us == pytest.approx(300.3, abs=0.5)
    assert all(r.limit == "memory" for r in b0.roles if r.bytes)


def test_gqa_reads_kv_heads_and_window_caps_depth():
    c = census_of_plan("qwen3", "tiny")
    full = bound(c, get_target("h200"), context=1000).role("kv_cache").bytes
    per_position = c.facts.kv_heads * 2 * c.facts.head_dim * 2
    assert full == c.facts.blocks * (1000 + 1) * per_position   # KV heads, not query heads
    c.facts.sliding_window, c.facts.swa_blocks = 128, [0]
    windowed = bound(c, get_target("h200"), context=1000).role("kv_cache").bytes
    assert windowed == (128 + 1000 + 2) * per_position


def test_batch_makes_weight_roles_compute_bound_past_the_crossover():
    c = census_of_plan("qwen3", "tiny")
    t = get_target("h200")
    cross = bound(c, t, batch=1).role("ffn_down").crossover_batch
    assert cross and cross > 1
    assert bound(c, t, batch=max(1, int(cross) - 1)).role("ffn_down").limit == "memory"
    assert bound(c, t, batch=int(cross) + 2).role("ffn_down").limit == "compute"


def test_bound_json_contract(tiny_model, capsys):
    assert main(["bound", tiny_model, "--target", "h100-sxm", "--context", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"target", "bandwidth_bytes_per_s", "roles", "token_floor_us", "ceiling_tok_s"} <= d.keys()
    assert d["bandwidth_bytes_per_s"] == 3.35e12
    for r in d["roles"]:
        assert {"role", "bytes", "flops", "floor_us", "limit"} <= r.keys()
    assert d["token_floor_us"] == pytest.approx(sum(r["floor_us"] for r in d["roles"]))
    assert d["ceiling_tok_s"] == pytest.approx(1e6 / d["token_floor_us"])
    floors = [r["floor_us"] for r in d["roles"]]
    assert floors == sorted(floors, reverse=True)


def test_measured_bandwidth_wins_over_spec():
    t = get_target("apple-m3")
    assert t.bandwidth == 89.9e9 and t.bandwidth_fact[1].status == "measured"


def test_a_new_gpu_is_a_data_edit(tiny_model, tmp_path, capsys, monkeypatch):
    extra = tmp_path / "mine.toml"
    extra.write_text('[newchip]\ndescription = "a chip no code knows"\n'
                     'memory_bandwidth = { value = 2.0e12, unit = "B/s", status = "spec", source = "its datasheet", date = "2026-11-29" }\n')
    assert main(["bound", tiny_model, "--target", "newchip", "--targets", str(extra), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["target"] == "newchip" and d["bandwidth_bytes_per_s"] == 2.0e12
    monkeypatch.setenv("BOLTBEAM_TARGETS", str(extra))
    assert "newchip" in registry()


def test_targets_registry_has_facts_with_provenance(capsys):
    assert main(["targets", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"rtx5090", "h200", "h100-sxm", "apple-m3"} <= d.keys()
    assert d["rtx5090"]["facts"]["memory_bandwidth"]["value"] == 1.7e12
    assert d["rtx5090"]["facts"]["multiprocessors"]["value"] == 170
    assert d["rtx5090"]["facts"]["thread_group_width"]["value"] == 32
    assert d["apple-m3"]["facts"]["measured_bandwidth"]["value"] == 89.9e9
    for t in d.values():
        for f in t["facts"].values():
            assert f["status"] in ("spec", "measured", "derived") and f["source"] and f["date"] and f["unit"]


@pytest.mark.parametrize("body,message", [
    ('[x]\nmemory_bandwidth = 5\n', "needs a value and unit"),
    ('[x]\nmemory_bandwidth = { value = 1e12, unit = "B/s", status = "guess", source = "s", date = "d" }\n', "status"),
    ('[x]\nmultiprocessors = { value = 10, unit = "count", status = "spec", source = "s", date = "d" }\n', "memory_bandwidth"),
    ('not toml [', "not valid TOML"),
    ('[x]\nmemory_bandwidth = { value = nan, unit = "B/s", status = "spec", source = "s", date = "d" }\n', "positive number"),
    ('[x]\nmemory_bandwidth = { value = inf, unit = "B/s", status = "spec", source = "s", date = "d" }\n', "positive number"),
    ('[x]\nmemory_bandwidth = { value = 4800, unit = "B/s", status = "spec", source = "s", date = "d" }\n', "unit mistake"),
    ('[x]\nmemory_bandwidth = { value = 4.8, unit = "parsecs", status = "spec", source = "s", date = "d" }\n', "unit 'parsecs'"),
    ('[x]\nmemory_bandwidth = { value = 4.8, unit = "s", status = "spec", source = "s", date = "d" }\n', "measures time"),
    ('[x]\nmemory_bandwidth = { value = 1e30, unit = "B/s", status = "spec", source = "s", date = "d" }\n', "unit mistake"),
])
def test_bad_target_files(tiny_model, tmp_path, capsys, body, message):
    f = tmp_path / "t.toml"
    f.write_text(body)
    assert main(["bound", tiny_model, "--target", "x", "--targets", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_units_are_read_and_converted(tiny_model, tmp_path, capsys):
    """4,800 GB/s is 4.8e12 B/s: the floor is the same as for the same bandwidth written in B/s."""
    f = tmp_path / "t.toml"
    fact = 'memory_bandwidth = {{ value = {}, unit = "{}", status = "spec", source = "s", date = "d" }}'
    f.write_text(f"[gb]\n{fact.format(4800, 'GB/s')}\n[b]\n{fact.format(4.8e12, 'B/s')}\n"
                 f"[tb]\n{fact.format(4.8, 'TB/s')}\n")
    floors = []
    for name in ("gb", "b", "tb"):
        assert main(["bound", tiny_model, "--target", name, "--targets", str(f), "--json"]) == 0
        floors.append(json.loads(capsys.readouterr().out)["token_floor_us"])
    assert floors[0] == pytest.approx(floors[1]) == pytest.approx(floors[2])
    assert get_target("gb", [str(f)]).facts["memory_bandwidth"].unit == "B/s"


def test_unknown_target(tiny_model, capsys):
    assert main(["bound", tiny_model, "--target", "nosuchgpu"]) == 2
    assert "unknown target 'nosuchgpu'" in capsys.readouterr().err


def test_bound_table_prints(smollm2, capsys):
    assert main(["bound", smollm2, "--target", "rtx5090", "--context", "512"]) == 0
    out = capsys.readouterr().out
    assert "token floor" in out and "ceiling" in out and "kv_cache" in out


def test_host_is_measured_once_then_cached(tmp_path, monkeypatch):
    """`host` is this machine: measured through tinygrad on first use, then read from the cache."""
    import subprocess
    import sys
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path), "DEV": "CPU"}
    code = ("from boltbeam.bound.targets import get_target; t = get_target('host'); "
            "print(t.facts['measured_bandwidth'].status, t.bandwidth)")
    # In a fresh process: tinygrad compiles there, not in this test process.
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    status, bandwidth = first.stdout.split()
    assert status == "measured" and float(bandwidth) > 1e8
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from boltbeam.bound import targets
    assert targets.host_cache_path().is_file()
    # The second use reads the cache: measuring again (in a child process) would fail here.
    monkeypatch.setattr(targets.subprocess, "run", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("measured twice")))
    assert get_target("host").bandwidth == float(bandwidth)
