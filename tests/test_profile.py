"""The tinygrad adapter on CPU, end to end: profile -> trace -> account, compare, export.

Each profile runs in its own process, as the CLI does: the adapter's hook must be in place before
tinygrad first compiles its executors."""
import dataclasses
import json
import os
import statistics
import subprocess
import sys

import pytest

from boltbeam.cli import main
from boltbeam.files import sha256_file
from boltbeam.measure import trace as tracefile
from boltbeam.read.census import take_census
from boltbeam.read.roles import read_kind


def profile(model: str, out, *extra: str) -> tracefile.Trace:
    cmd = [sys.executable, "-m", "boltbeam", "profile", model, "--device", "CPU", "--out", str(out), "--json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["out"] == str(out)
    return tracefile.load(out)


@pytest.fixture(scope="module")
def tiny_trace(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces") / "tiny.json"
    return out, profile(tiny_model, out, "--context", "8", "--tokens", "3")


def test_trace_holds_both_passes(tiny_model, tiny_trace):
    _, t = tiny_trace
    assert len(t.token_wall_us) == 3 and len(t.kernel_pass_wall_us) == 3
    assert t.kernel_tokens == [0, 1, 2]
    # prefill + 2 warm-up tokens for the plain JIT, 3 for the timed JIT, then plain and timed alternating
    assert len(t.output_tokens) == 1 + 2 + 3 + 2 * 3
    assert t.kernel_pass.timing == "hcq" and t.kernel_pass.in_graph      # tinygrad's own graph timestamps
    assert t.kernel_pass.jit_calls == [1, 1, 1] and min(t.kernel_pass.graph_launches) >= 1
    assert t.environment["engine"] == "tinygrad" and t.environment["engine_version"] == "0.13.0"
    assert t.environment["model_sha256"] == sha256_file(tiny_model)
    assert t.workload["context"] == 8 and t.route["label"] == "tinygrad-scheduler"
    per_token = [len(t.kernels_of_token(i)) for i in range(3)]
    assert per_token[0] > 10 and len(set(per_token)) == 1     # the same kernels every token
    for k in t.kernels:
        assert k.duration_us >= 0 and k.start_us is not None
        assert all(k.category != "copy" and k.global_size for k in t.kernels)   # the kernel timeline holds kernels
    for ks in t.by_token().values():    # one device timeline per token, kernels in graph order
        assert min(k.start_us for k in ks) == 0 and all(k.duration_us > 0 for k in ks)


def test_every_weight_table_is_read_by_a_kernel_of_its_role(tiny_model, tiny_trace):
    _, t = tiny_trace
    census = take_census(tiny_model)
    kernels = t.kernels_of_token(0)
    read = {name for k in kernels for name in k.tensors}
    tables = {x.name for x in census.tensors if x.role and read_kind(x.role) in ("table", "row")}
    assert tables <= read
    role_of = {x.name: x.role for x in census.tensors if not x.tied}
    for k in kernels:
        if k.category == "weights":
            assert k.role in {role_of[n] for n in k.tensors}, (k.name, k.role, k.tensors)
    # Each block's attention reads the KV cache: a kernel that touches no weight, found by its buffers.
    assert sum(k.category == "attention" for k in kernels) >= census.facts.blocks


def test_account_of_a_cpu_trace_is_consistent(tiny_model, tiny_trace, capsys):
    path, _ = tiny_trace
    code = main(["account", str(path), "--model", tiny_model, "--target", "host-like", "--targets", _host_like()])
    capsys.readouterr()
    code = main(["account", str(path), "--model", tiny_model, "--target", "host-like", "--targets", _host_like(), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code in (0, 3)             # CPU timing is noisy: closing is not promised, honesty is
    assert d["residual_us"] == pytest.approx(d["wall_us"] - sum(l["us"] for l in d["lines"]), abs=1e-6)
    assert d["closed"] == (abs(d["residual_us"]) <= 0.01 * d["wall_us"])
    assert (code == 0) == (d["closed"] and not d["refusals"])     # refused: it says why, and exits 3
    assert {l["kind"] for l in d["lines"]} >= {"floor", "role", "gap"}
    assert not {l["kind"] for l in d["lines"]} & {"graph", "host"}      # no line is a difference of two totals
    # Launch and sync measured on the token (the device's own stamps bracket it), not from facts.
    assert d["timing"] == "hcq" and "timing" in {l["kind"] for l in d["lines"]}
    assert [l["label"] for l in d["lines"] if l["kind"] == "launch"] == [
        "host before the first launch", "first launch to first kernel", "synchronization and read-back"]
    assert all(l["us"] > 0 for l in d["lines"] if l["kind"] == "launch")


def _host_like() -> str:
    # A fixed CPU-like target, so the test does not spend time measuring this machine.
    path = os.path.join(os.path.dirname(__file__), "data", "cpu_target.toml")
    return path


def test_compare_a_trace_with_itself_and_export(tiny_trace, tmp_path, capsys):
    path, t = tiny_trace
    assert main(["compare", str(path), str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["net_us"] == 0 and all(r["diff_us"] == 0 for r in d["regions"])
    chrome = tmp_path / "chrome.json"
    assert main(["export-trace", str(path), "--chrome", str(chrome)]) == 0
    events = json.loads(chrome.read_text())["traceEvents"]
    assert sum(e.get("cat") != "user_annotation" and e["ph"] == "X" for e in events) == len(t.kernels)


def test_smollm2_tied_output_projection_is_found(smollm2, tmp_path, capsys):
    path = tmp_path / "smollm2.json"
    t = profile(smollm2, path, "--context", "4", "--tokens", "2", "--no-hash")
    kernels = t.kernels_of_token(0)
    output = [k for k in kernels if k.role == "output"]
    assert len(output) == 1 and output[0].tensors == ["token_embd.weight"]
    assert any(k.role == "token_embd" for k in kernels)          # the lookup, one row
    census = take_census(smollm2)
    assert {k.role for k in kernels if k.category == "weights"} == {
        r for r, v in census.roles().items() if read_kind(r) in ("table", "row")}
    # The same pipeline on: account (with the vocabulary line the tied table feeds) and compare.
    code = main(["account", str(path), "--model", smollm2, "--target", "host-like", "--targets", _host_like(), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code in (0, 3) and (code == 0) == (d["closed"] and not d["refusals"])
    output = next(line for line in d["lines"] if line.get("role") == "output")
    assert output["measured_us"] > 0 and output["floor_us"] > 0
    assert main(["compare", str(path), str(path), "--json"]) == 0


def test_bad_input_to_profile(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["profile", str(tmp_path / "missing.gguf"), "--device", "CPU", "--out", str(out)]) == 2
    assert "no such file" in capsys.readouterr().err and not out.exists()
    assert main(["profile", str(tmp_path / "x.gguf"), "--device", "CPU", "--warmup", "1", "--out", str(out)]) == 2
    assert not out.exists()
    capsys.readouterr()


@pytest.mark.parametrize("timing", ["cupti", "launch"])
def test_cuda_timings_need_cuda(tiny_model, tmp_path, capsys, timing):
    out = tmp_path / "t.json"
    assert main(["profile", tiny_model, "--device", "CPU", "--timing", timing, "--out", str(out)]) == 2
    assert "needs CUDA" in capsys.readouterr().err and not out.exists()


def test_a_machine_without_the_device_is_one_line(tiny_model, tmp_path, capsys):
    from tinygrad import Device
    try:
        Device["CUDA"]
        pytest.skip("this machine has CUDA")
    except Exception:
        pass
    out = tmp_path / "t.json"
    assert main(["profile", tiny_model, "--device", "CUDA", "--timing", "launch", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tinygrad cannot open CUDA here" in err and err.count("\n") == 1 and not out.exists()


def test_launch_cost_is_measured_and_counted(tiny_model, tmp_path, capsys):
    """measure-target --launch decodes calibration models with profile's own timing, brackets included, so
    its facts are BRACKETED; the account of a bracketed trace measures launch and sync on the token and
    says what the facts would have counted (their value times the token's launches)."""
    from boltbeam.bound.measure_target import target_toml
    from boltbeam.bound.targets import get_target
    from boltbeam.measure.launch_cost import BRACKETED, LaunchCost, calibration_samples
    samples = calibration_samples("CPU", 256, tokens=4, depths=(1, 3))
    assert [s.blocks for s in samples] == [1, 3] and samples[0].kernels < samples[1].kernels
    assert all(s.timing == "hcq" and len(s.plain_wall_us) == len(s.span_us) == len(s.lead_us) == 4 for s in samples)
    assert all(len(s.timing_cost_us) == 4 for s in samples)    # the device's stamps bracket every token
    # the fit is tested on its own (test_launch_fit); here the facts' way into the account
    cost = LaunchCost("CPU", 256, per_call_us=512.0, per_kernel_us=-1.5, samples=samples, method=BRACKETED)
    assert cost.timing == "hcq"
    toml = tmp_path / "host.toml"
    m = {"device": "CPU", "size_bytes": 1 << 20, "read_bandwidth": 1e10, "copy_bandwidth": 1e10,
         "read_samples_s": [1.0], "copy_samples_s": [1.0], "launch": dataclasses.asdict(cost)}
    toml.write_text(target_toml("cal", "calibrated here", m))
    assert get_target("cal", [str(toml)]).facts["launch_sync_per_call"].method == BRACKETED
    trace = tmp_path / "t.json"
    profile(tiny_model, trace, "--context", "8", "--tokens", "3")
    main(["account", str(trace), "--model", tiny_model, "--target", "cal", "--targets", str(toml), "--json"])
    d = json.loads(capsys.readouterr().out)
    kernels = len(tracefile.load(trace).kernels_of_token(0))
    assert any(f"would have counted {512.0 - 1.5 * kernels:,.1f} µs" in n for n in d["notes"]), d["notes"]
    assert "launch and sync" not in {line["label"] for line in d["lines"]}


def test_launch_fit():
    from boltbeam.errors import BadInput
    from boltbeam.measure.launch_cost import LaunchSample, fit

    def sample(kernels, outside):
        return LaunchSample(1, "cupti", kernels, 1, [1000.0 + outside] * 3, [1000.0] * 3, None, None)
    assert fit([sample(40, 420.0), sample(400, 600.0), sample(800, 800.0)]) == pytest.approx((400.0, 0.5))
    assert fit([sample(40, 380.0), sample(800, 0.0)]) == pytest.approx((400.0, -0.5))   # timing costs more a kernel
    with pytest.raises(BadInput, match="too noisy"):
        fit([sample(40, -10.0), sample(800, 500.0)])
    # A big model's tokens scatter by milliseconds: its point barely moves the line the precise ones draw.
    scattered = LaunchSample(1, "hcq", 800, 1, [3000.0, 0.0, 3500.0, 500.0], [1000.0] * 4, None, None)
    per_call, per_kernel = fit([sample(40, 420.0), sample(400, 600.0), scattered])
    assert per_call == pytest.approx(400.0, abs=2.0) and per_kernel == pytest.approx(0.5, abs=0.01)
    # Brackets measured what the timing added to each span: it comes back out before the line is drawn.
    stretched = [LaunchSample(1, "cupti", k, 1, [1000.0 + o] * 3, [1000.0 + 0.3 * k] * 3, None, None,
                              timing_cost_us=[0.3 * k] * 3) for k, o in ((40, 420.0), (400, 600.0), (800, 800.0))]
    assert fit(stretched) == pytest.approx((400.0, 0.5))


def test_audit_end_to_end_on_cpu(tiny_model, tmp_path):
    """The README's main command on the tiny model: profile, account and page in one process."""
    out = tmp_path / "audit"
    cmd = [sys.executable, "-m", "boltbeam", "audit", tiny_model, "--device", "CPU", "--context", "4", "--tokens", "2",
           "--target", "host-like", "--targets", _host_like(), "--price-per-hour", "1", "--out", str(out), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert sorted(p.name for p in out.iterdir()) == ["account.json", "audit.json", "report.html", "trace.json"]
    t = tracefile.load(out / "trace.json")
    doc = json.loads((out / "audit.json").read_text())
    assert doc["wall_us"] == summary["wall_us"] == statistics.median(t.token_wall_us)
    assert doc["account"]["closed"] == (summary["account"] == "closed") and doc["context"] == 4
    assert doc["returns"]["measured"]["usd_per_mtok"] == pytest.approx(1e6 / (3600 * summary["tok_s"]))
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 3 and f"{summary['wall_us']:,.2f}" in html   # roofline, tie-out, timeline


def test_what_attention_alone_wrote_is_attention(tiny_model):
    """Launch order matters: a kernel that reads only buffers attention kernels wrote (a softmax, a split
    attention's combine) is attention; one that also reads another buffer is not."""
    from types import SimpleNamespace

    from boltbeam.measure.tinygrad_run import Classifier, Launch
    from boltbeam.read.census import take_census
    buf = lambda n: SimpleNamespace(base=None, _base=None, nbytes=n, offset=0)
    for b in (kv := buf(4096), scores := buf(64), probs := buf(64), x := buf(128), out := buf(128), y := buf(8)):
        b.base = b
    c = Classifier(take_census(tiny_model), file_size=1, kv_bases={id(kv)}, rope_bases=set())
    launch = lambda reads, writes: Launch("k", "kernel", [1], [1], None, None, None, reads, writes)
    assert c.classify(launch([kv, x], [scores]))[0] == "attention"          # reads the cache
    assert c.classify(launch([scores], [probs]))[0] == "attention"          # reads only what attention wrote
    assert c.classify(launch([probs, x], [out]))[0] != "attention"          # also reads the residual stream
    assert c.classify(launch([out], [y]))[0] != "attention"                 # its input's last writer was not attention


BRACKET_PROBE = """
import json
from tinygrad import Tensor
from boltbeam.measure.tinygrad_run import Recorder
log, out = [], []
class Events:
    def first(self): log.append("first")
    def last(self): log.append("last")
    def elapsed_us(self): return 42.0
rec = Recorder("CPU", "hcq", brackets=Events())
with rec.install():
    x = Tensor.arange(64).float().contiguous().realize()
    for _ in range(2):   # one by one, as a token outside any graph: a reduction, then a kernel that reads it
        rec.opened_ns, log[:] = None, []
        (x - x.max()).exp().realize()
        out.append([list(log), rec.bracket_us(), rec.opened_ns is not None])
    rec.opened_ns, log[:] = None, []
    x.tolist()           # a copy alone launches no kernel
    out.append([list(log), rec.bracket_us(), rec.opened_ns is not None])
print(json.dumps(out))
"""


def test_only_a_command_queue_device_gets_the_devices_own_stamps():
    """tinygrad's PYTHON device has no command queues: it gets no brackets (rather than a crash in the
    hot path), where the CPU gets them."""
    from boltbeam.measure.tinygrad_run import Recorder, _HcqBracket
    assert isinstance(Recorder("CPU", "hcq").brackets, _HcqBracket)
    assert Recorder("PYTHON", "hcq").brackets is None


def test_brackets_open_at_a_tokens_first_launch_and_close_after_its_last():
    """The recorder's CUDA-event brackets, with a stand-in for the events on CPU: opened once a token, at its
    first kernel launch (the host's clock read there too), re-closed after every launch (so the last launch
    closes it), read only when opened. In a fresh process: tinygrad's hook must precede its first compile."""
    done = subprocess.run([sys.executable, "-c", BRACKET_PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DEV": "CPU"})
    assert done.returncode == 0, done.stderr[-2000:]
    *tokens, copy = json.loads(done.stdout.strip().splitlines()[-1])
    for log, bracket, opened in tokens:
        assert log[0] == "first" and log.count("first") == 1 and log.count("last") >= 2 and log[-1] == "last"
        assert bracket == 42.0 and opened
    assert copy == [[], None, False]


def test_the_cpu_account_closes_three_times_of_three(tiny_model, tmp_path, capsys):
    """Issue 7's CPU promise: profile and account the tiny model three times, each in its own process;
    every account closes within 1%. Launch and sync are measured on the tokens, the timing's cost by
    the device's own stamps around them; the target's bandwidth is a fixed CPU-like one (it sets only
    the floor line, which every account takes back out)."""
    residuals = []
    for run in range(3):
        trace = tmp_path / f"run{run}.json"
        profile(tiny_model, trace, "--context", "8", "--tokens", "48")
        code = main(["account", str(trace), "--model", tiny_model, "--target", "host-like", "--targets", _host_like(),
                     "--json"])
        d = json.loads(capsys.readouterr().out)
        residuals.append(d["residual_fraction"])
        assert "timing" in {line["kind"] for line in d["lines"]}
        assert code == 0 and d["closed"], (run, residuals, d["refusals"])
    assert all(abs(r) <= 0.01 for r in residuals)
