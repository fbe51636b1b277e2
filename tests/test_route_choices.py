"""A route carries BEAM's choices (issue 32, item 2): written after a run with BEAM, it holds each kernel's opts as
BEAM chose them, and a fresh process with an empty tinygrad cache rebuilds those kernels from it, searching
nothing, through profile --route and the Python entry point (which generate uses); a tampered choice is one line."""
import inspect
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from boltbeam.cli import main as run_main
from boltbeam.measure import route as routes, trace as tracefile
from tests.processes import once

DEPTH = ("--context", "4", "--tokens", "5")      # the tiny model's shared traces' depth

# tinygrad's own BEAM search, narrowed to one action so the tiny model's 27 decode kernels search in seconds,
# not minutes, and to upcasts of at most 8 (BEAM_UPCAST_MAX; its default 256 lets a kernel take up to six UPCASTs,
# each round's compile longer than the last: 16 s of the search's 26 on 2 cores, now 7 s; BEAM still chooses zero to
# three opts a kernel): the search, its timing and its choice are tinygrad's; every beam_search call is counted.
COUNTED = """
import os, sys
os.environ["BEAM_UPCAST_MAX"] = "8"
from tinygrad.codegen.opt import Opt, OptOps, search
search.actions[:] = [Opt(OptOps.UPCAST, 0, 2)]
calls, orig = [], search.beam_search
search.beam_search = lambda *a, **k: calls.append(1) or orig(*a, **k)
import atexit
atexit.register(lambda: print(f"beam searches: {len(calls)}", file=sys.stderr))
"""
PROFILE = COUNTED + """
from boltbeam.cli import main
sys.exit(main(sys.argv[1:]))
"""
# The Python entry point as a user's program runs it: four greedy tokens after the profile's own prompt.
ENTRY = COUNTED + """
import json
from dataclasses import asdict
from boltbeam.measure.tinygrad_run import prompt_tokens
from boltbeam.read.census import take_census
from boltbeam.route import use
model, route = sys.argv[1], sys.argv[2]
with use.load(model, route, positions=32, tokenizer=(None, [])) as routed:
    gen = routed.net.generate(list(prompt_tokens(4, take_census(model).facts.vocabulary)))
    tokens = [next(gen) for _ in range(4)]
print(json.dumps({"tokens": tokens, "applied": sorted(routed.applied.kernels),
                  "compiled": [asdict(c) for c in routed.applied.compiled.values()]}))
"""


def fresh(script: str, folder, *args: str) -> subprocess.CompletedProcess:
    """`script` in a new process on the CPU, tinygrad's caches (its BEAM results among them) empty in `folder`."""
    folder.mkdir(exist_ok=True)
    env = {**os.environ, "DEV": "CPU", "CACHEDB": str(folder / "cache.db"), "XDG_CACHE_HOME": str(folder)}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def searches(done: subprocess.CompletedProcess) -> int:
    return int(done.stderr.rsplit("beam searches: ", 1)[1].split()[0])


def by_kernel(compiled) -> dict:
    return {c["kernel"]: c["opts"] for c in compiled}


@pytest.fixture(scope="session")
def written(tiny_model, shared):
    """The tiny model profiled at DEPTH with BEAM 1, and the route written after it (once a test run)."""
    from boltbeam.files import sha256_file
    folder = shared / "beam_route"
    trace = folder / "trace.json"

    def make(path):
        done = fresh(PROFILE, folder, "profile", tiny_model, "--device", "CPU", "--beam", "1", *DEPTH,
                     "--out", str(trace))
        (folder / "searches").write_text(str(searches(done)))
        route = routes.Route(sha256_file(tiny_model), routes.engine(), "CPU", "host-like", "tinygrad_opts",
                             "tinygrad scheduler", [], beam=1)
        routes.save(routes.judged_by(route, str(trace)), path)
    path = once(folder.with_suffix(".json"), make)
    return SimpleNamespace(path=str(path), trace=tracefile.load(str(trace)), route=json.loads(path.read_text()),
                           searches=int((folder / "searches").read_text()))


def test_a_route_written_after_beam_carries_what_beam_chose(written):
    compiled, settings = written.route["compiled"], written.trace.route.settings
    # every kernel BEAM searched, as compiled, and what it was compiled for
    assert len(compiled) == written.searches > 0
    assert by_kernel(compiled) == by_kernel(settings["compiled"])
    assert any(c["opts"] for c in compiled)                     # BEAM chose opts, not nothing
    from tinygrad import Device
    assert written.route["compiler"] == settings["compiler"] == routes.compiler_of(Device["CPU"].renderer)
    route = routes.load(written.path)
    assert route.beam == 1 and route.load_beam() == 0 and len(route.opts_by_kernel()) == len(compiled)


def test_profile_with_the_route_searches_nothing(written, tiny_model, tiny_default, tmp_path):
    out = tmp_path / "t.json"
    done = fresh(PROFILE, tmp_path, "profile", tiny_model, "--device", "CPU", "--route", written.path, *DEPTH,
                 "--out", str(out))
    assert searches(done) == 0
    settings = tracefile.load(str(out)).route.settings
    assert settings["beam"] == 0 and settings["carried_applied"] == settings["kernels_carried"] == len(written.route["compiled"])
    assert by_kernel(settings["compiled"]) == by_kernel(written.route["compiled"])     # the opts each kernel ran with
    tokens = tracefile.load(str(out)).output_tokens
    assert tokens == written.trace.output_tokens == tracefile.load(tiny_default.path).output_tokens   # tinygrad's own route's


def test_the_python_entry_point_loads_it_searching_nothing(written, tiny_model, tmp_path):
    done = fresh(ENTRY, tmp_path, tiny_model, written.path)
    assert searches(done) == 0
    ran = json.loads(done.stdout)
    assert ran["applied"] == sorted(by_kernel(written.route["compiled"]))
    assert by_kernel(ran["compiled"]) == by_kernel(written.route["compiled"])
    assert ran["tokens"] == written.trace.output_tokens[:4]


# --- a tampered choice: one line, exit 2, nothing written ---------------------------------------------------

def carrying(tiny_model, **kw) -> dict:
    """A route carrying one kernel as BEAM compiled it on this CPU."""
    from tinygrad import Device
    from boltbeam.files import sha256_file
    return {"format": "boltbeam-route", "version": 1, "model_sha256": sha256_file(tiny_model), "engine": routes.engine(),
            "device": "CPU", "target": "host-like", "family": "tinygrad_opts", "provenance": "tinygrad scheduler",
            "choices": [], "beam": 1, "compiler": routes.compiler_of(Device["CPU"].renderer),
            "compiled": [{"kernel": "ab" * 12, "name": "r_4", "opts": [{"op": "UPCAST", "axis": 0, "arg": 2}]}], **kw}


def kernel(**kw) -> list:
    return [{"kernel": "ab" * 12, "name": "r_4", "opts": [{"op": "UPCAST", "axis": 0, "arg": 2}], **kw}]


@pytest.mark.parametrize("tamper, says", [
    ({"compiled": kernel(opts=[{"op": "UPCASTS", "axis": 0, "arg": 2}])}, "is not a tinygrad opt"),
    ({"compiled": kernel(opts=[{"op": "TC", "axis": 0, "arg": 2}])}, "is not a tinygrad opt"),
    ({"compiled": kernel(opts=[{"op": "UPCAST", "axis": 0, "arg": 2 ** 70}])}, "is not a tinygrad opt"),
    ({"compiled": kernel(opts=[{"op": "UPCAST", "axs": 0, "arg": 2}])}, "unknown key 'axs' (did you mean 'axis'?)"),
    ({"compiled": kernel(opt=[])}, "unknown key 'opt' (did you mean 'opts'?)"),
    ({"compiled": kernel(kernel="../../x")}, "kernel must be a kernel key"),
    ({"compiled": {"ab" * 12: []}}, "compiled must be a list"),
    ({"compiler": None}, "need the compiler they were compiled for"),
    ({"compiler": "CUDARenderer CUDA::sm_90"}, "its kernels were compiled for CUDARenderer CUDA::sm_90; this compiles for "),
    ({"model_sha256": None}, "names 1 kernel(s) but no model"),
    ({"model_sha256": "1" * 64}, "was made for another model"),
    ({"engine": "tinygrad 0.12.0"}, "was made with tinygrad 0.12.0"),
    ({"device": "CUDA"}, "was made on CUDA; this runs on CPU"),
], ids=["op", "tc-arg", "huge-arg", "opt-typo", "kernel-typo", "key", "not-a-list", "no-compiler", "other-compiler",
        "no-model", "other-model", "other-tinygrad", "other-device"])
def test_a_tampered_route_is_refused_before_the_model_loads(tiny_model, tmp_path, tamper, says, capsys, monkeypatch):
    (tmp_path / "r.json").write_text(json.dumps(carrying(tiny_model, **tamper)))
    monkeypatch.setenv("DEV", "CPU")
    try:
        rc = run_main(["profile", tiny_model, "--device", "CPU", "--route", str(tmp_path / "r.json"),
                       "--out", str(tmp_path / "t.json")])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err and says in err, err
    assert not (tmp_path / "t.json").exists()


FIT = """
import json, sys
from tinygrad import Tensor
from tinygrad.uop.ops import Ops
from boltbeam.errors import BadInput
from boltbeam.measure import route as routes
compute = lambda: (Tensor.ones(7, 11).contiguous() * 3).sum(1)
key, = [routes.kernel_key(c.src[0]) for c in compute().schedule_linear().src           # the sum's kernel
        if c.src[0].op is Ops.SINK and any(u.op is Ops.REDUCE for u in c.src[0].toposort())]
doc = json.loads(sys.argv[1])
doc["compiled"][0]["kernel"] = key
open(sys.argv[2], "w").write(json.dumps(doc))
try:
    with routes.apply(sys.argv[2]) as applied:
        compute().realize()
except BadInput as e:
    sys.exit(f"refused: {e}")
print(sorted(applied.kernels) == [key])
"""


@pytest.mark.parametrize("opt, raised", [({"axis": None}, "TypeError"), ({"op": "PADTO", "arg": 0}, "ZeroDivisionError"),
                                         ({"axis": 5}, "KernelOptError"), ({}, None)],
                         ids=["no-axis", "pad-to-0", "axis-past", "fits"])
def test_carried_opts_that_do_not_fit_their_kernel_are_one_line(tiny_model, tmp_path, opt, raised):
    """On a kernel of 7 x 11, in a fresh process: tinygrad says an opt does not fit in many ways (a TypeError, a
    division by zero, its own KernelOptError), each one line naming the kernel; an opt that fits is applied."""
    doc = carrying(tiny_model, compiled=kernel(opts=[{"op": "UPCAST", "axis": 0, "arg": 7, **opt}]))
    done = subprocess.run([sys.executable, "-c", FIT, json.dumps(doc), str(tmp_path / "r.json")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "DEV": "CPU"})
    if raised is None:
        assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-3000:]
        return
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert "refused: route kernel " in done.stderr and f"do not fit the kernel ({raised}: " in done.stderr, done.stderr


def test_carried_leaves_the_routes_own_choices_and_a_gone_trace_alone(tiny_model, tmp_path):
    route = routes.Route("0" * 64, routes.engine(), "CPU", "t", "f", "tinygrad scheduler", [
        routes.Choice("ab" * 12, "r", {}, [routes.RoutedOpt("UPCAST", 0, 4)], 1.0, 2.0)], beam=1)
    settings = {"compiler": "C", "compiled": [{"kernel": k, "name": "r", "opts": []} for k in ("ab" * 12, "cd" * 12)]}
    kept = routes.carried(route, settings, "trace t")
    assert [c.kernel for c in kept.compiled] == ["cd" * 12] and kept.compiler == "C"
    assert kept.opts_by_kernel()["ab" * 12][0].arg == 4            # the route's own choice over BEAM's
    assert routes.judged_by(route, str(tmp_path / "gone.json")) is route and route.load_beam() == 1


def test_a_vocabulary_naming_no_pre_tokenizer_is_split_the_default_way(tiny_model):
    from boltbeam.route import use
    kv = use.tokenizer_kv(tiny_model)
    assert "tokenizer.ggml.pre" not in kv
    tokenizer, notes = use.tokenizer_of(kv)             # (tinygrad.llm's own reader wants the name: a KeyError)
    assert tokenizer.preset == inspect.signature(type(tokenizer)).parameters["preset"].default and len(notes) == 1 and "the file names no pre-tokenizer" in notes[0]
