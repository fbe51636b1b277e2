"""llama.cpp kernel by kernel: its kernels given roles from facts (order, launch grid), on one token
recorded on the H200 and on tokens built from the tiny model; the runner's bad input."""
import dataclasses
import json
import os
import pathlib

import pytest

from boltbeam.account import account
from boltbeam.account.compare import region_times
from boltbeam.bound.roofline import bound
from boltbeam.bound.targets import get_target
from boltbeam.cli import main
from boltbeam.measure.graph_timing import Cupti
from boltbeam.errors import BadInput
from boltbeam.measure import llama_cpp_run
from boltbeam.measure.trace import load
from boltbeam.measure.llama_cpp_roles import align, assign, products_in_order
from boltbeam.switches import CUPTI_PER_LAUNCH
from boltbeam.measure.trace import Environment, Kernel, Provenance, RouteRecord, Trace, Workload
from boltbeam.read.census import TensorEntry, take_census

RECORDED = pathlib.Path(__file__).parent / "data" / "llama_h200_token.json"
FAKES = pathlib.Path(__file__).parent / "fake_engines"    # stand-ins for llama-cpp-python and cupti-python
H200 = get_target("h200")


def with_fakes(monkeypatch) -> None:
    """The stand-ins on the path of this process (its checks) and of the child it starts (the run)."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FAKES), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv(CUPTI_PER_LAUNCH.name, "1")      # the stand-in CUPTI times tokens per launch (opt-in on a real one)


def fake_binding():
    """The stand-in binding's module, read from its file (its times are the test's expectations)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fake_llama_cpp", FAKES / "llama_cpp" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace_of(kernels: list[Kernel]) -> Trace:
    return Trace(Environment(engine="llama.cpp"), Workload(context=0), RouteRecord("llama.cpp"), token_wall_us=[100.0],
                 provenance=Provenance("profile", notes=[]), kernels=kernels)


def recorded() -> tuple[list[Kernel], list[TensorEntry]]:
    d = json.loads(RECORDED.read_text())
    kernels = [Kernel(token=0, index=i, name=name, duration_us=dur, start_us=start, global_size=grid, local_size=block)
               for i, (name, grid, block, start, dur) in enumerate(d["kernels"])]
    tables = [TensorEntry(name=n, role=r, format=f, shape=s, bytes=b, bytes_per_token=b, block=blk)
              for n, r, f, s, b, blk in d["tables"]]
    return kernels, tables


def test_a_recorded_h200_token_gets_every_weight_role():
    kernels, tables = recorded()
    out = assign(trace_of(kernels), tables)
    weights = [k for k in out.kernels if k.category == "weights"]
    assert sum(len(k.tensors) for k in weights) == len(tables) == 253   # 36 blocks x 7 tables + the output
    assert len(weights) == 36 * 6 + 1                                   # gate and up run as one kernel
    fused = [k for k in weights if len(k.tensors) == 2]
    assert len(fused) == 36 and all(k.tensors[0].endswith("ffn_gate.weight") and k.tensors[1].endswith("ffn_up.weight")
                                    and k.tensors[0].split(".")[1] == k.tensors[1].split(".")[1] for k in fused)
    by_name = {t.name: t for t in tables}
    for k in weights:
        assert k.global_size[0] == by_name[k.tensors[0]].shape[1]      # one row per group on this GPU
        assert k.bytes == sum(by_name[t].bytes_per_token for t in k.tensors)
    assert weights[-1].role == "output" and weights[-1].global_size[0] == by_name["output.weight"].shape[1]
    categories = {k.category for k in out.kernels}
    assert {"attention", "norm", "kv_write"} <= categories
    times = region_times(out)
    assert times["gate_up"] == pytest.approx(sum(k.duration_us for k in fused))
    assert "roles from facts" in out.provenance.notes[-1]


def test_a_token_missing_a_product_keeps_no_role():
    kernels, tables = recorded()
    missing = [k for i, k in enumerate(kernels) if i != 5]     # block 0's attn_k product never ran
    out = assign(trace_of(missing), tables)
    assert all(k.role is None for k in out.kernels)
    assert "adapter-incomplete" in out.provenance.notes[-1]


def test_a_product_whose_grid_holds_no_table_keeps_no_role():
    kernels, tables = recorded()
    wrong = list(kernels)
    wrong[5] = dataclasses.replace(wrong[5], global_size=[4096, 1, 1])   # attn_k's 1024 rows read as 4096
    assert all(k.role is None for k in assign(trace_of(wrong), tables).kernels)


def test_align_takes_a_fused_pair_only_of_one_shape_and_format(tiny_model):
    tables = products_in_order(take_census(tiny_model))
    rows = [t.shape[1] for t in tables]
    groups = align(rows, tables)
    assert groups is not None and all(len(g) == 1 for g in groups)
    # Two rows per group throughout: still one alignment
    assert align([r // 2 for r in rows], tables) == groups
    # Gate and up as one kernel: the pair is found wherever a block's two tables share shape and format
    gate = next(i for i, t in enumerate(tables) if t.role == "ffn_gate")
    fused = rows[:gate] + rows[gate + 1:]
    got = align(fused, tables)
    assert got is not None and [t.role for t in got[gate]] == ["ffn_gate", "ffn_up"]
    # Three tables of one shape and format read by two products: (1+2, 3) and (1, 2+3) both align,
    # so neither is guessed
    three = [dataclasses.replace(tables[0], name=f"t{i}") for i in range(3)]
    assert align([rows[0]] * 2, three) is None and align([rows[0]] * 3, three) == [[t] for t in three]
    # A table's rows in the wrong place: no alignment
    assert align(rows[1:] + rows[:1], tables) is None


def test_profile_needs_cupti_and_refuses_bad_counts(tiny_model):
    with pytest.raises(BadInput, match="tokens"):
        llama_cpp_run.profile(tiny_model, context=0, tokens=0)
    with pytest.raises(BadInput, match="cupti-python"):   # CPU machine: checked before any model loads
        llama_cpp_run.profile(tiny_model, context=0, tokens=2)


def test_the_child_runs_end_to_end_with_stand_ins(tiny_model, monkeypatch):
    with_fakes(monkeypatch)
    ticks = []
    t = llama_cpp_run.profile(tiny_model, context=4, tokens=3, warmup=1, model_hash=False,
                              progress=lambda stage, n: ticks.append(stage))
    assert ticks == ["prefill", "warm-up"] + ["plain"] * 3 + ["timed", "timed per launch"] * 3
    assert len(t.token_wall_us) == len(t.kernel_pass_wall_us) == 3 and t.kernel_tokens == [0, 1, 2]
    assert t.output_tokens == [3] * 11                     # prefill, warm-up, 3 plain, 3 + 3 timed: the stand-in peaks at 3
    assert t.kernel_pass.graph_launches == [1, 1, 1] and t.kernel_pass.timing == "cupti"
    assert {k.launch for k in t.kernels} == {0}        # each token's kernels ran in its one graph
    tables = products_in_order(take_census(tiny_model))
    for token in t.kernel_tokens:
        read = [name for k in t.kernels_of_token(token) if k.category == "weights" for name in k.tensors]
        assert read == [x.name for x in tables]            # every table, once, in compute order
    assert {k.category for k in t.kernels if k.category != "weights"} == {"norm"}
    assert t.environment.engine == "llama.cpp" and "0.0-fake" in t.environment.engine_version


def test_no_token_is_timed_per_launch_unless_asked(tiny_model, monkeypatch):
    """CUPTI's graph records after its kernel records crashed cuGraphLaunch on an H200: without the opt-in, the
    child switches nothing, times no token per launch and its trace says why."""
    with_fakes(monkeypatch)
    monkeypatch.delenv(CUPTI_PER_LAUNCH.name)
    ticks = []
    t = llama_cpp_run.profile(tiny_model, context=4, tokens=3, warmup=1, model_hash=False,
                              progress=lambda stage, n: ticks.append(stage))
    assert ticks == ["prefill", "warm-up"] + ["plain"] * 3 + ["timed"] * 3
    assert len(t.kernel_tokens) == 3 and any(CUPTI_PER_LAUNCH.name in n for n in t.provenance.notes)
    assert "per launch" not in t.provenance.timing


def test_llama_cpp_launch_and_sync_measured_on_its_tokens(tiny_model, monkeypatch):
    """The stand-in's decode step works on the host, launches its graph and returns; recording each kernel
    costs each kernel on the "device" and the host at the launch. Beside each token timed per kernel, one
    timed per launch (graph records and the launch call): the timing's cost is the two spans' difference, and
    launch and sync come from the tokens timed per launch, never from tinygrad's launch facts nor from the
    tokens whose every kernel was recorded (their host spends 5 ms more before its launch)."""
    fake = fake_binding()
    with_fakes(monkeypatch)
    trace = llama_cpp_run.profile(tiny_model, context=4, tokens=4, warmup=1, model_hash=False)
    kp = trace.kernel_pass
    kernels = len(trace.kernels_of_token(0))
    assert len(kp.launch_wall_us) == len(kp.launch_host_us) == 4
    assert trace.timing_cost_us() == pytest.approx([kernels / 2 * fake.KERNEL_COST_US] * 4)   # two kernels a table
    assert all(lead - host == pytest.approx(fake.LATENCY_US) for lead, host in zip(kp.launch_lead_us, kp.launch_host_us))
    assert all(lead > fake.CUPTI_HOST_US for lead in kp.lead_us)        # the timed tokens' host, slowed by the timing
    acc = account(trace, bound(take_census(tiny_model), H200, context=4, batch=1), H200)
    lines = {x.label: x for x in acc.lines}
    assert [x.label for x in acc.lines if x.kind == "launch"] == [
        "host before the first launch", "first launch to first kernel", "synchronization and read-back"]
    assert fake.HOST_US <= lines["host before the first launch"].us < fake.HOST_US + fake.CUPTI_HOST_US / 2
    assert lines["first launch to first kernel"].us == pytest.approx(fake.LATENCY_US)
    assert lines["timing's cost"].us == pytest.approx(-kernels / 2 * fake.KERNEL_COST_US)
    assert acc.timing_cost_per_kernel_us == pytest.approx(fake.KERNEL_COST_US / 2)
    assert not any("measured through tinygrad" in n for n in acc.notes)


def test_profile_engine_llama_cpp_from_the_command_line(tiny_model, monkeypatch, tmp_path, capsys):
    with_fakes(monkeypatch)
    out = tmp_path / "llama.json"
    code = main(["profile", tiny_model, "--device", "CUDA", "--engine", "llama.cpp", "--context", "4", "--tokens", "2",
                 "--warmup", "1", "--no-hash", "--out", str(out), "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["kernel_tokens"] == 2
    assert load(str(out)).route.label.startswith("llama.cpp")
    monkeypatch.setenv("FAKE_LLAMA_LOAD", "fail")            # a file llama.cpp cannot load: one line, exit 2
    bad = tmp_path / "bad.json"
    code = main(["profile", tiny_model, "--device", "CUDA", "--engine", "llama.cpp", "--tokens", "2", "--warmup", "1",
                 "--no-hash", "--out", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "llama.cpp cannot load" in err and err.count("\n") == 1 and not bad.exists()


def test_audit_through_llama_cpp(tiny_model, monkeypatch, tmp_path, capsys):
    with_fakes(monkeypatch)
    out = tmp_path / "audit"
    code = main(["audit", tiny_model, "--device", "CUDA", "--engine", "llama.cpp", "--context", "4", "--tokens", "2",
                 "--warmup", "1", "--no-hash", "--target", "h200", "--out", str(out)])
    capsys.readouterr()
    assert code == 0 and (out / "report.html").exists()
    assert load(str(out / "trace.json")).environment.engine == "llama.cpp"
    acc = json.loads((out / "account.json").read_text())
    assert not any("measured through tinygrad" in n for n in acc["notes"])   # launch and sync measured on its tokens,
    assert [x["label"] for x in acc["lines"] if x["kind"] == "launch"] == [   # none from tinygrad's facts
        "host before the first launch", "first launch to first kernel", "synchronization and read-back"]


def test_profile_reference_holds_tinygrads_greedy_tokens_to_llama_cpps(tiny_model, monkeypatch, tmp_path):
    """`profile --reference`: the same prompt ids decoded through llama.cpp (the stand-in, whose greedy token is
    always 3); every step where tinygrad's token differs is counted, the first named, the trace written with
    llama.cpp's tokens, exit 3. Without the binding, one line before anything is profiled."""
    import subprocess
    import sys
    with_fakes(monkeypatch)
    out = tmp_path / "t.json"
    cmd = [sys.executable, "-m", "boltbeam", "profile", tiny_model, "--device", "CPU", "--context", "4", "--tokens", "2",
           "--no-hash", "--reference", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    trace = load(str(out))
    ours, theirs = trace.output_tokens, trace.provenance.reference.output_tokens
    assert theirs == [3] * len(ours) and "llama.cpp" in trace.provenance.reference.engine
    differ = [i for i, t in enumerate(ours) if t != 3]
    assert done.returncode == 3 and differ, done.stderr[-2000:]
    assert f"{len(differ)} of the {len(ours)} greedy tokens both decoded differ" in done.stderr
    assert f"the first at step {differ[0]}: {ours[differ[0]]} where" in done.stderr
    monkeypatch.setenv("PYTHONPATH", "")           # no binding: refused before the profile
    bare = subprocess.run(cmd[:-1] + [str(tmp_path / "u.json")], capture_output=True, text=True, timeout=600)
    assert bare.returncode == 2 and "needs llama-cpp-python" in bare.stderr and not (tmp_path / "u.json").exists()
