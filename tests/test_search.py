"""The search: BubbleBeam's legal settings, FutureSight's order, tinygrad building what BubbleBeam allows,
and `boltbeam search` end to end on CPU (route, ledger reuse, profile with and without the route).

The pure parts run here. Everything that touches tinygrad runs in its own process (the adapter hooks
tinygrad before it compiles), and those processes are shared through one module fixture, two at a time
(this machine has two cores): none of the assertions on them depend on how fast anything ran.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from boltbeam import switches
from boltbeam.bound.targets import get_target
from boltbeam.errors import BadInput
from boltbeam.judge.verdicts import DIAGNOSTIC, SEARCH_SPACE_INCOMPLETE, VERDICTS
from boltbeam.ledger.store import Ledger
from boltbeam.measure import trace as tracefile
from boltbeam.foresight.future import REJECT_RATIO, Work, foresee, predict
from boltbeam.foresight.space import SPLITS, WHICH, KernelShape, families, propose, searchable
from tests.processes import DEPTH, once

CPU_TARGETS = str(Path(__file__).parent / "data" / "cpu_target.toml")
H200 = get_target("h200")
HOST = get_target("host-like", [CPU_TARGETS])
FAM_ALL = searchable("tinygrad_opts")
# The family's splits alone (every reduction split on the longest axis): the arithmetic below is theirs.
FAM = dataclasses.replace(FAM_ALL, parameters={p: v for p, v in FAM_ALL.parameters.items() if p in SPLITS})
SHAPE = KernelShape("k0", "r_256_1024", output=256, reduce=1024, outputs=256, output_axis=0)
NO_THREADS = "the target declares no max_threads_per_group"
OUTPUTS = ["baseline.json", "candidate.json", "route.json", "search.json"]


def only(fam, **values):
    """The family with one value per parameter (1, or 0 for an axis choice, unless given): one setting."""
    return dataclasses.replace(fam, parameters={p: (values.get(p, 0 if p in WHICH else 1),) for p in fam.parameters})


def reason_of(shape=SHAPE, target=H200, fam=FAM, **setting) -> str | None:
    """Why BubbleBeam rejects this one setting (None: legal)."""
    space = propose(shape, only(fam, **setting), target)
    assert space.size == 1
    assert len(space.legal) + len(space.rejected) == 1
    return next(iter(space.rejected), None)


def every_setting(fam):
    names = list(fam.parameters)
    return [dict(zip(names, v)) for v in itertools.product(*(fam.parameters[n] for n in names))]


def fits_shape(s, shape=SHAPE) -> bool:
    return shape.output % (s["local"] * s["upcast"]) == 0 and shape.reduce % (s["group"] * s["unroll"]) == 0


# --- BubbleBeam ---------------------------------------------------------------------------------

def test_bubblebeam_rejects_each_setting_under_the_rule_it_breaks():
    assert reason_of(local=128, group=16).startswith("max_threads_per_group:")     # 2,048 threads > 1,024
    assert reason_of(local=64, group=16) is None                                   # exactly 1,024: allowed
    assert reason_of(local=128, upcast=4) == "does not divide the output axis"     # 512 into 256
    assert reason_of(group=256, unroll=8) == "does not divide the reduce axis"     # 2,048 into 1,024
    assert reason_of(shape=dataclasses.replace(SHAPE, reduce=None), unroll=2) == "no reduce axis to split"
    assert reason_of(shape=dataclasses.replace(SHAPE, output=None), upcast=2) == "no output axis to split"
    assert reason_of(upcast=8, unroll=16).startswith("registers_per_thread:")      # 8 x 16 x 2 = 256 > 255
    # The shape is checked first: this one also breaks max_threads_per_group, but is counted once, here.
    assert reason_of(local=128, group=16, upcast=4) == "does not divide the output axis"


def test_local_memory_rule_and_what_a_rule_needs():
    fam = families("""
[lm]
expressed_by = "tinygrad-opts"
parameters = { local = [1, 8, 128], group = [1, 16], upcast = [1, 2, 4] }
rules = [
  { product = ["local", "group"], op = "<=", fact = "max_threads_per_group", why = "too many threads", needs = ["local", "group"] },
  { product = ["local", "group", "upcast", "bytes_per_partial"], op = "<=", fact = "local_memory_per_group", why = "partials must fit", needs = ["group"] },
]
constants = { bytes_per_partial = 1024 }
""")["lm"]
    assert fam.constants == {"bytes_per_partial": 1024} and len(fam.rules) == 2
    # 8 x 16 x 4 x 1,024 = 524,288 bytes > h200's 232,448
    assert reason_of(fam=fam, local=8, group=16, upcast=4) == "local_memory_per_group: partials must fit"
    assert reason_of(fam=fam, local=8, group=16, upcast=1) is None                 # 131,072 bytes fit
    # 128 x 2 x 1,024 = 262,144 is over too, but without a group there are no partial sums to keep
    assert reason_of(fam=fam, local=128, group=1, upcast=2) is None
    space = propose(SHAPE, fam, H200)
    assert space.rejected == {"does not divide the output axis": 2,              # 128x4 into 256
                              "max_threads_per_group: too many threads": 2,      # 128x16, upcast 1 or 2
                              "local_memory_per_group: partials must fit": 2}    # 8x16x4 and 8x16x2
    assert space.size == 3 * 2 * 3


def test_multiple_of_and_divides_rules():
    fam = families("""
[ops]
expressed_by = "tinygrad-opts"
parameters = { local = [1, 16, 32, 64], upcast = [1, 2, 3, 4, 8] }
rules = [
  { product = ["local"], op = "multiple_of", fact = "thread_group_width", why = "whole warps", needs = ["local"] },
  { product = ["upcast", "four"], op = "divides", fact = "max_threads_per_group", why = "divides", needs = ["upcast"] },
]
constants = { four = 4 }
""")["ops"]
    assert reason_of(fam=fam, local=16) == "thread_group_width: whole warps"
    assert reason_of(fam=fam, local=32) is None and reason_of(fam=fam, local=64) is None
    assert all(reason_of(fam=fam, upcast=u) is None for u in (2, 4, 8))           # 8, 16, 32 divide 1,024
    assert reason_of(fam=fam, local=32, upcast=8, shape=dataclasses.replace(SHAPE, output=4096)) is None
    # 3 x 4 = 12 does not divide 1,024 (on an output axis 3 does divide)
    assert reason_of(fam=fam, upcast=3, shape=dataclasses.replace(SHAPE, output=768)) == "max_threads_per_group: divides"


def test_bubblebeam_on_h200_lists_exactly_the_settings_the_facts_allow():
    space = propose(SHAPE, FAM, H200)
    assert space.size == math.prod(len(v) for v in FAM.parameters.values()) == 8 * 9 * 4 * 5
    threads, lmem = H200.fact("max_threads_per_group"), H200.fact("local_memory_per_group")
    regs = H200.fact("registers_per_thread")

    def allowed(s) -> bool:
        return (fits_shape(s) and s["local"] * s["group"] <= threads
                and s["upcast"] * s["unroll"] * FAM.constants["registers_per_value"] <= regs
                and (s["group"] == 1 or s["local"] * s["group"] * s["upcast"] * FAM.constants["bytes_per_partial"] <= lmem))
    expected = [s for s in every_setting(FAM) if allowed(s)]
    assert space.legal == expected
    assert any(s["local"] > 1 and s["group"] > 1 for s in space.legal)            # a GPU gets thread groups
    assert NO_THREADS not in space.rejected
    assert space.rejected["does not divide the output axis"] > 0 and space.rejected["does not divide the reduce axis"] > 0
    assert sum(n for r, n in space.rejected.items() if r.startswith("max_threads_per_group:")) > 0


def test_bubblebeam_on_a_target_without_thread_groups():
    """host-like declares no max_threads_per_group: no setting may use local or group."""
    space = propose(SHAPE, FAM, HOST)
    assert space.size == len(every_setting(FAM))
    assert space.legal and all(s["local"] == 1 and s["group"] == 1 for s in space.legal)
    shaped = [s for s in every_setting(FAM) if fits_shape(s)]
    assert space.rejected[NO_THREADS] == sum((s["local"], s["group"]) != (1, 1) for s in shaped)
    regs = HOST.fact("registers_per_thread")      # 16: upcast x unroll x 2 <= 16
    assert space.legal == [s for s in shaped if (s["local"], s["group"]) == (1, 1)
                           and s["upcast"] * s["unroll"] * 2 <= regs]
    assert len(space.legal) == 10
    assert len(space.legal) + sum(space.rejected.values()) == 1440


def test_reduction_splits_choose_their_axis():
    """group_axis / unroll_axis pick the k-th longest reduction axis; each split must divide its own."""
    shape = KernelShape("k1", "r", output=256, reduce=48, outputs=256, output_axis=0, reduces=(48, 2, 32))
    assert reason_of(shape, fam=FAM_ALL, group=16) is None                          # 16 into 48, the longest
    assert reason_of(shape, fam=FAM_ALL, group=32) == "does not divide the reduce axis"
    assert reason_of(shape, fam=FAM_ALL, group=32, group_axis=1) is None            # the second longest: 32
    assert reason_of(shape, fam=FAM_ALL, group=16, group_axis=1, unroll=16, unroll_axis=1) \
        == "does not divide the reduce axis"                                         # 16 x 16 into 32
    assert reason_of(shape, fam=FAM_ALL, group=16, group_axis=1, unroll=16) is None  # different axes
    assert reason_of(shape, fam=FAM_ALL, group=2, group_axis=2) is None              # the length-2 axis
    assert reason_of(shape, fam=FAM_ALL, group=4, group_axis=2) == "does not divide the reduce axis"
    assert reason_of(shape, fam=FAM_ALL, group_axis=1) == "an axis chosen for no split (the same as the first)"
    short = dataclasses.replace(shape, reduces=(48,))
    assert reason_of(short, fam=FAM_ALL, group=4, group_axis=1) == "no such reduce axis"


def test_opts_name_the_axis_tinygrad_numbers():
    """REDUCE-order places: unroll first; when it takes its whole axis, a later group's place moves up."""
    from boltbeam.search.compiler import opts_of
    shape = KernelShape("k1", "r", output=256, reduce=48, outputs=256, output_axis=3, reduces=(2, 48, 32))
    ops = lambda **st: [(o.op, o.axis, o.arg) for o in opts_of({"local": 1, "group": 1, "upcast": 1, "unroll": 1,
                                                                 "group_axis": 0, "unroll_axis": 0, **st}, shape)]
    assert ops(group=16) == [("GROUPTOP", 1, 16)]                              # the longest is second in order
    assert ops(group=16, group_axis=1) == [("GROUPTOP", 2, 16)]
    assert ops(unroll=2, unroll_axis=2, group=16) == [("UNROLL", 0, 2), ("GROUPTOP", 0, 16)]   # axis 0 gone
    assert ops(unroll=2, unroll_axis=2, group=8, group_axis=1) == [("UNROLL", 0, 2), ("GROUPTOP", 1, 8)]
    assert ops(unroll=4, group=4, local=2, upcast=2) == [("UNROLL", 1, 4), ("LOCAL", 3, 2), ("UPCAST", 3, 2),
                                                          ("GROUPTOP", 1, 4)]


# --- families ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("[broken\nparameters = {", "not valid TOML"),
    ('[f]\nexpressed_by = "tinygrad-opts"\nparameters = { local = [1, 2.5] }', "parameter 'local' needs a list of non-negative integers"),
    ('[f]\nparameters = { local = [1, true] }', "parameter 'local' needs a list"),
    ('[f]\nparameters = { local = [] }', "parameter 'local' needs a list"),
    ('[f]\nparameters = { local = [1, -2] }', "parameter 'local' needs a list"),
    ('[f]\nparameters = { local = [1, 2] }\nrules = [{ product = ["local"], op = "<", fact = "max_threads_per_group" }]',
     "a rule needs op"),
    ('[f]\nparameters = { local = [1, 2] }\nrules = [{ product = ["local"], op = "<=" }]', "a rule needs op"),
    ('[f]\nparameters = { local = [1, 2] }\nrules = [{ product = ["local"], op = "<=", fact = "x", needs = ["lcoal"] }]',
     "lcoal, which is not a parameter"),
    ('[f]\nparameters = { local = [1, 2] }\nrules = [{ product = ["local"], op = "<=", fact = "x", when = "kernal" }]',
     "kernal, which is not a parameter"),
    ('[f]\nparameters = { local = [1, 2] }\nconstants = { b = 0 }', "constants must be positive integers"),
    ('[f]\ndescription = "no parameters"', "needs a parameters table"),
])
def test_malformed_families_are_bad_input(text, message):
    with pytest.raises(BadInput, match=message):
        families(text)


def test_only_tinygrad_opts_families_are_searched_per_kernel():
    known = families()
    assert set(known) == {"tinygrad_opts", "repacked_layout", "split_attention", "gemv", "fusion", "constants_once",
                          "half_cache", "direct_replay", "flash_attention_tile"}
    with pytest.raises(BadInput, match="expressed by generated-layout"):
        searchable("repacked_layout")     # `search --family repacked_layout` judges it whole (search/choose.py)
    with pytest.raises(BadInput, match="expressed by generated-layout"):
        searchable("split_attention")     # built at load by profile --split-attention
    assert FAM.parameters["local"] == (1, 2, 4, 8, 16, 32, 64, 128) and FAM.expressed_by == "tinygrad-opts"
    with pytest.raises(BadInput, match="expressed by generated-layout"):
        searchable("gemv")                # `search --family gemv --on ROUTE` judges it whole
    with pytest.raises(BadInput, match="expressed by generated-route"):
        searchable("flash_attention_tile")   # listed, no generator yet
    with pytest.raises(BadInput) as e:
        searchable("nope")
    assert "unknown family 'nope'" in str(e.value)
    assert all(name in str(e.value) for name in known)
    odd = families('[odd]\nexpressed_by = "tinygrad-opts"\nparameters = { warps = [1, 2] }')
    with pytest.raises(BadInput, match="warps map to no tinygrad opt"):
        searchable("odd", odd)


# --- FutureSight ---------------------------------------------------------------------------------

WORK = Work(bytes=4_000_000, flops=8_000_000, outputs=256)


def without(target, *facts):
    return dataclasses.replace(target, facts={k: f for k, f in target.facts.items() if k not in facts})


def test_foresee_orders_by_prediction_and_says_why_it_sets_aside():
    settings = [dict(local=l, group=g, upcast=u, unroll=r)
                for l in (1, 8) for g in (1, 16, 256) for u in (1, 8) for r in (1, 16)]
    sight = foresee(WORK, settings, H200)
    assert len(sight.ordered) + len(sight.rejected) == len(settings)
    assert sight.ordered and sight.rejected
    us = [p.us for _, p in sight.ordered]
    assert us == sorted(us)
    best = us[0]
    assert best == min(predict(WORK, s, H200).us for s in settings)
    assert all(u <= REJECT_RATIO * best for u in us)
    for s, p, why in sight.rejected:
        assert p.us > REJECT_RATIO * best and "over" in why and f"{REJECT_RATIO:g}x" in why
        assert p.us == predict(WORK, s, H200).us
    assert foresee(WORK, [], H200).ordered == [] and foresee(WORK, [], H200).rejected == []


def test_more_in_flight_predicts_no_slower_with_a_latency():
    """256 threads on h200 cannot cover its memory latency: each step of unroll puts more in flight."""
    preds = [predict(WORK, {"unroll": u}, H200) for u in (1, 2, 4, 8, 16)]
    assert all("little's law" in p.terms for p in preds)
    assert all(a.us >= b.us for a, b in zip(preds, preds[1:]))
    assert preds[-1].us < preds[0].us
    # grouping the reduction over more threads also puts more in flight
    assert predict(WORK, {"group": 16}, H200).memory_us < predict(WORK, {"group": 1}, H200).memory_us


def test_fewer_groups_than_multiprocessors_draw_their_share():
    """32 groups on h200's 132 multiprocessors: Little's law on their threads, times the share in use; with as
    many threads in more groups than multiprocessors, no such term."""
    from boltbeam.foresight.future import Calibration
    cal = Calibration()
    sms, latency = H200.fact("multiprocessors"), H200.fact("memory_latency")
    few = predict(WORK, {"local": 8}, H200, cal)                        # 256 threads, 32 groups
    assert "multiprocessors in use" in few.terms
    littles = min(H200.bandwidth, 256 * cal.bytes_in_flight_per_thread / latency)
    assert few.memory_us == pytest.approx(WORK.bytes / (littles * 32 / sms) * 1e6)
    many = predict(WORK, {"local": 1}, H200, cal)                       # the same threads, 256 groups
    assert "multiprocessors in use" not in many.terms
    assert many.memory_us == pytest.approx(WORK.bytes / littles * 1e6) and many.us < few.us


def test_a_fact_the_target_lacks_leaves_its_term_out():
    no_latency = without(HOST, "memory_latency")
    preds = [predict(WORK, {"unroll": u}, no_latency) for u in (1, 4, 16)]
    assert all("little's law" not in p.terms for p in preds)
    assert len({p.memory_us for p in preds}) == 1
    assert preds[0].memory_us == pytest.approx(WORK.bytes / HOST.bandwidth * 1e6)
    assert "little's law" in predict(WORK, {}, HOST).terms
    bare = without(HOST, *[k for k in HOST.facts if k != "memory_bandwidth"])
    p = predict(WORK, {"upcast": 4, "unroll": 8}, bare)
    assert p.terms == ["bandwidth"] and p.tail == 1.0 and p.compute_us == 0.0
    assert p.us == pytest.approx(WORK.bytes / HOST.bandwidth * 1e6)


# --- tinygrad: the search's processes, two at a time ---------------------------------------------

KERNELS_SCRIPT = r'''
import json, sys
from boltbeam.bound.targets import get_target
from boltbeam.measure.route import RoutedOpt
from boltbeam.search.compiler import build, capture, opts_of
from boltbeam.foresight.space import propose, searchable

model, targets = sys.argv[1], sys.argv[2]
from boltbeam.read.census import take_census
kernels = capture(model, take_census(model), "CPU", 8)
fam, target = searchable("tinygrad_opts"), get_target("host-like", [targets])

def applied(prg):
    return [[o.op.name, o.axis, o.arg] for o in prg.src[0].arg.applied_opts]

out = {"kernels": len(kernels), "keys": len({c.shape.key for c in kernels}),
       "launches": sum(c.kernel.launches for c in kernels), "min_launches": min(c.kernel.launches for c in kernels),
       "checked": []}
reductions = [c for c in kernels if c.shape.reduce is not None and c.shape.output is not None][:2]
elementwise = [c for c in kernels if c.shape.reduce is None and c.shape.output is not None][:1]
for c in reductions + elementwise:
    built = []
    for s in propose(c.shape, fam, target).legal:
        asked = opts_of(s, c.shape)
        prg = build(c, asked)
        built.append({"setting": s, "asked": [[o.op, o.axis, o.arg] for o in asked],
                      "refused": prg if isinstance(prg, str) else None,
                      "applied": None if isinstance(prg, str) else applied(prg)})
    default = build(c, None)
    local = build(c, [RoutedOpt("LOCAL", c.shape.output_axis, 2)])
    out["checked"].append({"name": c.shape.name, "reduce": c.shape.reduce, "built": built,
                           "default": default if isinstance(default, str) else [str(o) for o in default.src[0].arg.applied_opts],
                           "default_opts": c.kernel.default_opts,
                           "local": local if isinstance(local, str) else "built"})

# The GPU path on this CPU: the same kernels' shapes as tinygrad's CUDA scheduler sees them (a CUDA
# renderer that never compiles), BubbleBeam's legal settings on the h200's facts, every axis choice
# included, applied through tinygrad's own opt checks.
import random
from dataclasses import replace
import tinygrad.codegen as codegen
from tinygrad.codegen.opt import KernelOptError, Opt, OptOps, tc
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import CStyleLanguage, CUDARenderer
from boltbeam.search.compiler import _shape
cuda = CUDARenderer.__new__(CUDARenderer)
CStyleLanguage.__init__(cuda, Target("CUDA", "", "sm_90"))
cuda.tensor_cores = tc.get_cuda("sm_90")
h200, sinks, orig = get_target("h200"), [], codegen.apply_opts
def seen(sink, ren, beam=0):
    sinks.append(sink)
    return orig(sink, ren, beam=beam)
gpu = {"checked": 0, "axis_choices": 0, "refused": []}
for c in reductions:
    sinks.clear(); codegen.apply_opts = seen
    codegen.full_rewrite_to_sink(c.ast, cuda)
    codegen.apply_opts = orig
    shape = _shape(sinks[0], cuda, c.shape.key, c.shape.name)
    legal = propose(shape, fam, h200).legal
    rng = random.Random(0)
    chosen = [s for s in legal if s["group_axis"] or s["unroll_axis"]]
    for s in rng.sample(chosen, min(10, len(chosen))) + rng.sample(legal, min(10, len(legal))):
        opts = tuple(Opt(OptOps[o.op], o.axis, o.arg) for o in opts_of(s, shape))
        gpu["checked"] += 1
        gpu["axis_choices"] += bool(s["group_axis"] or s["unroll_axis"])
        try:
            codegen.full_rewrite_to_sink(c.ast.replace(arg=replace(c.ast.arg, opts_to_apply=opts)), cuda)
        except KernelOptError as e:
            gpu["refused"].append([s, str(e)[:200]])
out["gpu"] = gpu
print(json.dumps(out))
'''


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "DEV": "CPU", "PYTHONUNBUFFERED": "1"})


def _ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def search_cmd(model: str, out: Path, ledger: Path, *extra: str) -> list[str]:
    """`boltbeam search` per kernel on the CPU's target; its judge at 5 tokens a side (its minimum)."""
    return [sys.executable, "-m", "boltbeam", "search", model, "--device", "CPU", "--target", "host-like",
            "--targets", CPU_TARGETS, "--context", "8", "--tokens", "5", "--budget", "2", "--ledger", str(ledger),
            "--out", str(out), "--json", *extra]


def whole_search_cmd(model: str, family: str, ledger: Path) -> list[str]:
    """`boltbeam search` of one whole-token family on the CPU's target at a short depth (the caller adds --out)."""
    return [sys.executable, "-m", "boltbeam", "search", model, "--device", "CPU", "--target", "host-like",
            "--targets", CPU_TARGETS, "--family", family, *DEPTH, "--ledger", str(ledger), "--json"]


def profile_cmd(model: str, route: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "boltbeam", "profile", model, "--device", "CPU", "--context", "8",
            "--tokens", "2", "--route", route, "--out", str(out), "--json"]


@pytest.fixture(scope="module")
def runs(tiny_model, shared):
    """Made once a test run, by whichever pytest-xdist worker asks first; the others read it back."""
    made = once(shared / "search_runs.pickle", lambda path: path.write_bytes(pickle.dumps(_runs(tiny_model, shared))))
    return pickle.loads(made.read_bytes())


def _runs(tiny_model: str, shared: Path) -> SimpleNamespace:
    """First: the search with its judge (whose two profiles, without and with the route it writes, the tests
    read), beside the kernel capture. Then: the search again, from the ledger."""
    base = shared / "search"
    base.mkdir()
    ledger = base / "ledger.sqlite"
    script = base / "kernels.py"
    script.write_text(KERNELS_SCRIPT)
    r = SimpleNamespace(base=base, ledger=ledger, first_out=base / "first", second_out=base / "second")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(_run, search_cmd(tiny_model, r.first_out, ledger))
        side = pool.submit(_run, [sys.executable, str(script), tiny_model, CPU_TARGETS])
        r.first, r.kernels = first.result(), side.result()
    _ok(r.first)
    with Ledger(ledger, create=False) as led:
        r.entries_after_first = led.entries()
    r.second = _run(search_cmd(tiny_model, r.second_out, ledger, "--no-judge"))
    with Ledger(ledger, create=False) as led:
        r.entries_after_second = led.entries()
        r.verified = led.verify()
    return r


@pytest.fixture(scope="module")
def kernels(runs):
    done = _ok(runs.kernels)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_legal_setting_builds_and_tinygrad_refuses_locals_on_cpu(kernels, runs, first):
    assert kernels["kernels"] == kernels["keys"] > 10 and kernels["min_launches"] >= 1
    # The capture counts the same launches a decode token makes, as profile sees them (the judge's baseline).
    assert kernels["launches"] == len(tracefile.load(runs.first_out / "baseline.json").kernels_of_token(0))
    checked = kernels["checked"]
    assert len(checked) == 3 and sum(c["reduce"] is None for c in checked) == 1
    for c in checked:
        assert len(c["built"]) > 1, c["name"]
        for b in c["built"]:
            assert b["refused"] is None, (c["name"], b)
            assert b["applied"] == b["asked"], (c["name"], b)     # tinygrad applied exactly the setting's opts
        assert [b["asked"] for b in c["built"]].count([]) == 1     # the all-ones setting is no opt at all
        assert c["default"] == c["default_opts"]                   # None: tinygrad's own heuristics again
        assert c["local"].startswith("tinygrad refuses"), c
    assert any(b["setting"]["unroll"] > 1 for c in checked for b in c["built"])
    assert any(b["setting"]["upcast"] > 1 for c in checked for b in c["built"])


def test_every_legal_gpu_setting_passes_tinygrads_own_checks(kernels):
    """On the h200's facts, settings with thread groups and every axis choice, through tinygrad's CUDA
    scheduler (rendered here, never compiled): BubbleBeam's legal is tinygrad's legal."""
    gpu = kernels["gpu"]
    assert gpu["checked"] >= 20 and gpu["axis_choices"] >= 10
    assert gpu["refused"] == []


@pytest.fixture(scope="module")
def first(runs):
    return json.loads(_ok(runs.first).stdout)


@pytest.fixture(scope="module")
def second(runs):
    return json.loads(_ok(runs.second).stdout)


def test_first_search_writes_its_files_and_judges(runs, first):
    assert sorted(p.name for p in runs.first_out.iterdir()) == OUTPUTS
    assert json.loads((runs.first_out / "search.json").read_text()) == first
    assert first["timed_now"] > 0 and first["reused_from_ledger"] == 0
    # every kernel's default is timed once, then at most --budget of FutureSight's survivors
    per = first["per_kernel"]
    assert len(per) == first["kernels"] and first["refused_by_compiler"] == 0
    assert first["timed_now"] == sum(k["timed"] + 1 for k in per)
    assert all(k["timed"] == min(2, k["survivors"]) for k in per)
    assert all(k["survivors"] <= k["legal"] <= k["settings"] == math.prod(map(len, FAM_ALL.parameters.values()))
               for k in per)
    sp = first["space"]
    assert sp["settings"] == sum(k["settings"] for k in per) == sum(sp["rejected_by_reason"].values()) + sp["legal"]
    assert sp["rejected_by_reason"][NO_THREADS] > 0 and sp["survivors"] + sp["foreseen_out"] == sp["legal"]
    j = first["judgement"]
    assert j is not None and j["verdict"] in VERDICTS and j["reasons"]
    gates = j["gates"]
    assert set(gates) == {"correct", "route", "faster", "memory", "switch"}
    assert gates["route"]["status"] == "pass"                 # the candidate ran the route the search wrote
    assert all(g["status"] in ("pass", "fail", "no-evidence") for g in gates.values())
    assert (j["verdict"] == "promote") == all(g["status"] == "pass" for g in gates.values())
    assert j["candidate_id"] == f"route {runs.first_out / 'route.json'}"


def test_route_holds_the_choices_the_summary_made(runs, first):
    route = json.loads((runs.first_out / "route.json").read_text())
    assert route["format"] == "boltbeam-route" and route["provenance"] == "generated by search"
    assert route["target"] == "host-like" and route["device"] == "CPU" and route["family"] == "tinygrad_opts"
    assert route["engine"].startswith("tinygrad ")
    chosen = {k["kernel"]: k["choice"] for k in first["per_kernel"] if k["choice"] is not None}
    assert {c["kernel"]: c["setting"] for c in route["choices"]} == chosen
    assert len(route["choices"]) == first["routed_kernels"] > 0
    for c in route["choices"]:
        assert c["measured_us"] < 0.95 * c["default_us"]             # beats the default beyond noise
        assert c["setting"]["local"] == c["setting"]["group"] == 1   # host-like has no thread groups
        assert all(o["op"] in ("UPCAST", "UNROLL") for o in c["opts"])


def test_ledger_holds_every_timing_and_the_judgement(runs, first):
    entries = runs.entries_after_first
    timings = [e for e in entries if "measured_us" in e.scope and e.scope.get("setting") != "space"]
    incomplete = [e for e in entries if e.verdict == SEARCH_SPACE_INCOMPLETE]
    judged = [e for e in entries if e.candidate == first["judgement"]["candidate_id"]]
    assert len(timings) == first["timed_now"]
    assert len(incomplete) == len(first["search_space_incomplete"])
    assert len(judged) == 1 and judged[0].verdict == first["judgement"]["verdict"]
    assert len(entries) == first["timed_now"] + len(incomplete) + 1
    assert len({e.candidate for e in timings}) == len(timings)          # each setting timed once
    assert sum(e.verdict == DIAGNOSTIC for e in timings) == first["kernels"]   # the defaults
    assert all(e.scope["target"] == "host-like" and e.scope["device"] == "CPU" and e.scope["family"] == "tinygrad_opts"
               for e in timings)
    route = json.loads((runs.first_out / "route.json").read_text())
    recorded = {e.candidate: e.scope["measured_us"] for e in timings}
    for c in route["choices"]:
        setting = ",".join(f"{k}={v}" for k, v in sorted(c["setting"].items()))
        assert recorded[f"{c['kernel']}:{setting}"] == c["measured_us"]
        assert recorded[f"{c['kernel']}:default"] == c["default_us"]


def test_second_search_reuses_the_ledger(runs, first, second):
    assert sorted(p.name for p in runs.second_out.iterdir()) == ["route.json", "search.json"]
    assert second["timed_now"] == 0 and second["judgement"] is None
    assert second["reused_from_ledger"] == first["timed_now"]
    one = json.loads((runs.first_out / "route.json").read_text())
    two = json.loads((runs.second_out / "route.json").read_text())
    assert two["choices"] == one["choices"]
    assert runs.entries_after_second == runs.entries_after_first      # nothing timed, nothing recorded
    assert runs.verified.ok and runs.verified.entries == len(runs.entries_after_first)


def test_profile_with_and_without_the_route(runs, first):
    """The judge's two whole tokens, each `boltbeam profile` in a process of its own: with `--route none` and
    with the route file the search wrote, every kernel it names applied."""
    routed = tracefile.load(runs.first_out / "candidate.json")
    unrouted = tracefile.load(runs.first_out / "baseline.json")
    assert routed.route.label == "boltbeam-search"
    s = routed.route.settings
    assert s["kernels_applied"] == s["kernels_routed"] == first["routed_kernels"] > 0
    assert s["route"] == str(runs.first_out / "route.json") and s["provenance"] == "generated by search"
    assert unrouted.route.label == "tinygrad-scheduler" and unrouted.route.settings["beam"] == 0
    assert len(routed.kernels_of_token(0)) == len(unrouted.kernels_of_token(0))


# --- bad input: one line, exit 2, nothing written ------------------------------------------------

def one_line_error(cmd: list[str], code: int = 2) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    assert done.stdout == "" and done.stderr.count("\n") == 1 and done.stderr.startswith("boltbeam: error: ")
    return done.stderr


def bare_target(tmp_path) -> str:
    path = tmp_path / "bare.toml"
    path.write_text('[bare]\nmemory_bandwidth = { value = 2.0e10, unit = "B/s", status = "spec", '
                    'source = "test", date = "2026-11-30" }\n')
    return str(path)


@pytest.mark.parametrize("change, message", [
    (["--family", "nope"], "unknown family 'nope'"),
    (["--family", "gemv"], "search it --on a route whose layout form is kernel"),
    (["--family", "flash_attention_tile"], "expressed by generated-route"),
    (["--target", "bare"], "declares none of the facts family tinygrad_opts needs"),
    (["--budget", "0"], "need --budget >= 1"),
    (["--tokens", "4"], "the judge's minimum"),
    (["--target", "no-such-chip"], "no-such-chip"),
])
def test_bad_input_to_search(tiny_model, tmp_path, change, message):
    out, ledger = tmp_path / "out", tmp_path / "ledger.sqlite"
    cmd = search_cmd(tiny_model, out, ledger, "--targets", bare_target(tmp_path))
    cmd += change   # argparse keeps the last --family, --target, --budget, --tokens given
    assert message in one_line_error(cmd)
    assert list(tmp_path.iterdir()) == [tmp_path / "bare.toml"]     # no folder, no ledger


@pytest.fixture
def real_route(runs) -> dict:
    return json.loads((runs.first_out / "route.json").read_text())


def with_opt(route: dict, op: str, arg: int) -> dict:
    """The route with its first choice's opts replaced by one opt (a choice may have none: no opts)."""
    first = {**route["choices"][0], "opts": [{"op": op, "axis": 0, "arg": arg}]}
    return {**route, "choices": [first, *route["choices"][1:]]}


@pytest.mark.parametrize("make, message", [
    (lambda r: "{ not json", "not valid JSON"),
    (lambda r: json.dumps({"format": "boltbeam-trace", "version": 1}), "not a BoltBeam route"),
    (lambda r: json.dumps({**r, "version": 2}), "not a BoltBeam route"),
    (lambda r: json.dumps({**r, "engine": "tinygrad 0.0.1"}), "was made with tinygrad 0.0.1; this is tinygrad "),
    (lambda r: json.dumps({**r, "model_sha256": "0" * 64}), "was made for another model"),
    (lambda r: json.dumps({**r, "provenance": "hand-written"}), "may not ship"),
    (lambda r: json.dumps(with_opt(r, "FOO", 2)), "is not a tinygrad opt"),
    (lambda r: json.dumps(with_opt(r, "UPCAST", -1)), "is not a tinygrad opt"),
    (lambda r: json.dumps({k: v for k, v in r.items() if k != "choices"}), "malformed (KeyError"),
])
def test_bad_route_to_profile(tiny_model, tmp_path, real_route, make, message):
    route, out = tmp_path / "route.json", tmp_path / "t.json"
    route.write_text(make(real_route))
    err = one_line_error(profile_cmd(tiny_model, str(route), out))
    assert message in err and str(route) in err
    assert sorted(tmp_path.iterdir()) == [route]


def test_the_route_api_is_off_by_switch(tmp_path, monkeypatch):
    """`route.apply` with the switch set or `none` installs nothing; a bad route is one BadInput."""
    from tinygrad.engine import realize
    from boltbeam.measure import route as routes
    before = realize.to_program
    with routes.apply("none") as applied:
        assert realize.to_program is before and applied.kernels == set()
    monkeypatch.setenv(switches.ROUTE.name, "none")
    with routes.apply(str(tmp_path / "missing.json")):
        assert realize.to_program is before
    monkeypatch.delenv(switches.ROUTE.name)
    with pytest.raises(BadInput):
        with routes.apply(str(tmp_path / "missing.json")):
            pass


# --- FutureSight's constants are data, fitted to measurements -------------------------------------------

def test_calibration_is_read_from_data():
    from boltbeam.foresight.future import Calibration, calibration
    assert calibration("no-such-target") == Calibration()                       # the physical defaults
    assert calibration("h200").bytes_in_flight_per_thread >= 1                  # the packaged entry parses
    assert calibration("x", "[x]\nbytes_in_flight_per_thread = 64\nunroll_adds_in_flight = 0\n") == Calibration(64, False)
    both = "[x]\nbytes_in_flight_per_thread = 64\nunroll_adds_in_flight = 0\n[x.bandwidth_fraction]\n"
    cal = calibration("x", both + 'tensor_code = 0.25\nsource = "a run"\n')
    assert cal.fraction("tensor_code") == 0.25 and cal.fraction("generated_kernel") == 1.0
    assert calibration("h200").fraction("generated_kernel") < 1                 # measured on the H200
    for bad in ("[x]\nbytes_in_flight_per_thread = 0\nunroll_adds_in_flight = 0\n",
                both + "tensor_code = 1.5\n", both + "hand_written = 0.5\n",
                "[x]\nbytes_in_flight_per_thread = 8\nunroll_adds_in_flight = 2\n", "[x\n"):
        with pytest.raises(BadInput, match="futuresight.toml"):
            calibration("x", bad)


def test_fit_recovers_the_constants_that_made_the_times():
    """Times made by a known calibration: the fit orders them perfectly, the defaults do not."""
    from boltbeam.foresight.future import Calibration, Point, fit, within_spearman
    h200 = get_target("h200")
    truth = Calibration(128, False)
    settings = [{"local": l, "group": g, "upcast": 1, "unroll": u} for l in (1, 4) for g in (1, 4, 16) for u in (1, 8)]
    points = [Point(f"k{i}", Work(4_000_000 * (i + 1), 0, 256 * (i + 1)), s, predict(Work(4_000_000 * (i + 1), 0, 256 * (i + 1)), s, h200, truth).us)
              for i in range(3) for s in settings]
    cal, rho = fit(points, h200)
    assert rho == pytest.approx(1.0) and cal.unroll_adds_in_flight is False
    assert within_spearman(points, h200, Calibration())[0] < rho                # unrolling is not free in flight


def test_search_calibrate_bad_input_is_one_line(tmp_path, capsys):
    from boltbeam.cli import main
    summary = tmp_path / "s.json"
    summary.write_text(json.dumps({"per_kernel": [{"name": "k", "floor_us": 1.0, "outputs": 4}]}))
    for argv in (["--summary", str(summary), "--summary", str(summary), "--ledger", "x", "--target", "h200"],  # unpaired
                 ["--summary", str(summary), "--ledger", str(tmp_path / "none.sqlite"), "--target", "h200"]):
        assert main(["search-calibrate", *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "none.sqlite").exists()


def test_the_summary_reads_back_as_it_was_written(runs, first):
    """search.json is a typed record: read back field by field, it writes the same JSON again."""
    from boltbeam.search.summary import SearchSummary
    s = SearchSummary.load(str(runs.first_out / "search.json"))
    assert s.to_dict() == first
    assert s.space.legal == sum(k.legal for k in s.per_kernel) and s.kernels == len(s.per_kernel)
