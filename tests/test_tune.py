"""`boltbeam tune`: the whole-token families one after another on the tiny model, each promoted setting composing
the route; a second tune on the same ledger profiles nothing and writes the same route; the time budget kept;
the order the predicted savings give (against the route's own setting, or the route's profile); the output held to llama.cpp's tokens with --reference (the
stand-in binding); bad input one line, nothing written."""
import json
from statistics import median

import pytest
from markupsafe import escape

from boltbeam.cli import main
from boltbeam.judge.verdicts import VERDICTS
from boltbeam.account.compare import region_times
from boltbeam.ledger.store import Ledger
from boltbeam.measure import route as routes
from boltbeam.measure import trace as tracefile
from boltbeam.route import layout
from boltbeam.bound.targets import get_target
from boltbeam.measure.route import Route, engine
from boltbeam.read.census import take_census
from boltbeam.route.families import BY_NAME
from boltbeam.search import choose, tune
from tests.test_hostile3 import one_line
from tests.test_llama import with_fakes
from tests.test_search import CPU_TARGETS

FAMILIES = "repacked_layout,constants_once"


def tune_args(model: str, out, ledger, *extra: str) -> list[str]:
    return ["tune", model, "--device", "CPU", "--target", "host-like", "--targets", CPU_TARGETS, "--out", str(out),
            "--ledger", str(ledger), "--context", "4", "--tokens", "5", "--budget", "1", "--families", FAMILIES,
            "--processes", "1", "--json", *extra]


@pytest.fixture
def profiles(monkeypatch):
    """Every whole-token profile the search starts, by its trace's path (run as the search runs them)."""
    started = []
    real = choose.profile_elsewhere

    def counted(model, device, out, *flags, gpu=None):
        started.append(out)
        return real(model, device, out, *flags, gpu=gpu)
    monkeypatch.setattr(choose, "profile_elsewhere", counted)
    monkeypatch.setenv("DEV", "CPU")
    return started


def test_tune_composes_the_route_and_a_second_tune_times_nothing(tiny_model, tmp_path, profiles, capsys):
    out, ledger = tmp_path / "tuned", tmp_path / "ledger.sqlite"
    assert main(tune_args(tiny_model, out, ledger, "--processes", "2", "--decisive", "0", "--budget", "2")) == 0
    first = json.loads((out / "tune.json").read_text())
    assert json.loads(capsys.readouterr().out) == first
    # The route of no family, profiled before the first family is chosen (it prices them) and handed on as that
    # family's baseline, the layout's best predicted setting, constants once (the first round), then the layout's
    # next best on the route the first round left (the second: constants once has no other setting): each profiled
    # in two processes; a family whose route did not change reads the route's profile it has, and a promoted
    # setting's profile is the next one's baseline.
    assert len(profiles) == first["profiles"] == 8
    assert profiles[:2] == [str(out / "traces" / "route.trace.json"), str(out / "traces" / "route.trace.p2.json")]
    assert not list(out.rglob("baseline*.json"))
    judged = [s for s in first["steps"] if s["verdict"]]
    assert [(s["family"], s["round"]) for s in judged] == [(o["family"], 1) for o in first["order"]] + \
        [("repacked_layout", 2)] and all(s["timed"] for s in judged)
    census, target = take_census(tiny_model), get_target("host-like", [CPU_TARGETS])
    layout_first = next(s["setting"] for s in judged if s["family"] == "repacked_layout")
    assert judged[2]["setting"] == next(c.setting.flag for c in choose.foreseen(layout.FAMILY, census, 4, target)[0]
                                        if c.setting.flag != layout_first)
    assert judged[2]["before_us"] == ([s["after_us"] for s in judged[:2] if s["promoted"]] or [judged[0]["before_us"]])[-1]
    assert all(s["verdict"] in VERDICTS and s["after_us"] > 0 and s["before_us"] > 0 for s in judged)
    # Settings past the budget are counted, not listed (gemv alone has thousands).
    assert not any(s["skipped"] for s in first["steps"]) and first["unjudged"]
    assert all(u["why"].startswith(choose.BEYOND_BUDGET) and u["settings"] >= 1 for u in first["unjudged"])
    with Ledger(ledger, create=False) as led:
        entries = led.entries()
    assert [e.id for e in entries] == [s["ledger_id"] for s in judged]
    assert [e.verdict for e in entries] == [s["verdict"] for s in judged]
    # Each verdict holds for every pair of the two sides' processes, and the ledger keeps all four files.
    assert all(e.scope["processes"] == 2 and len(e.evidence) == 4 for e in entries)
    assert all(len(e.evidence) == len({ev["path"] for ev in e.evidence}) for e in entries)
    for e, s in zip(entries, judged):      # the token times: the median over both processes of a side
        sides = [[tracefile.load(ev["path"]) for ev in e.evidence[i::2]] for i in (0, 1)]
        assert [s["before_us"], s["after_us"]] == [median(t for tr in traces for t in tr.token_wall_us) for traces in sides]
    # Each promoted setting is in the route, and nothing else is.
    route = routes.load(str(out / "route.json"))
    assert route.provenance == "generated by search" and route.beam == 0
    promoted = {s["family"]: s["setting"] for s in judged if s["promoted"]}
    assert all(s["verdict"] == "promote" for s in judged if s["promoted"])
    assert ("layout" in route.families) == ("repacked_layout" in promoted)
    if "layout" in route.families:
        assert layout.Setting(**route.families["layout"]).flag == promoted["repacked_layout"]
    assert ("constants_once" in route.families) == ("constants_once" in promoted)
    last = [s["after_us"] for s in judged if s["promoted"]]
    assert first["start_us"] == judged[0]["before_us"] and first["final_us"] == (last or [first["start_us"]])[-1]
    page = (out / "report.html").read_text()
    assert "The journey" in page and "<svg" in page and "tinygrad&#39;s own route" in page
    # The route written, accounted from its profile (the last promoted setting's, its first process) on the target.
    last_trace = next(s for s in reversed(judged) if s["promoted"])
    assert first["final_trace"].endswith(f"/{last_trace['family']}_{last_trace['setting'].replace(':', '_')}.json")
    acc = first["final_account"]
    assert acc["wall_us"] == pytest.approx(median(tracefile.load(first["final_trace"]).token_wall_us), rel=0.5)
    assert "The route written, accounted on host-like" in page and first["no_account"] is None
    # No family is on tinygrad's route: each is priced from the profile of the route it went on, the first going
    # first for the largest saving on the route of no family; the output held to tinygrad's default route alone.
    assert sorted(o["family"] for o in first["order"]) == sorted(FAMILIES.split(","))
    for o in first["order"]:
        assert o["against"] == tune.PROFILE and o["why"] is None
        assert set(o["replaced_us"]) == set(BY_NAME[o["family"]].replaces.regions + BY_NAME[o["family"]].replaces.categories)
        assert o["against_us"] == pytest.approx(sum(o["replaced_us"].values()))
        assert o["gain_us"] == pytest.approx(o["against_us"] - o["best_us"])
    start = (str(out / "traces" / "route.json"), routes.load(str(out / "traces" / "route.json")))
    on_start = [tune.outlook(BY_NAME[f], census, 4, target, start, tracefile.load(profiles[0])).gain_us
                for f in FAMILIES.split(",")]
    assert first["order"][0]["gain_us"] == pytest.approx(max(on_start))
    assert first["checked_against"] == tune.DEFAULT_ONLY and first["reference"] is None and first["start_output"] is None
    assert first["unmeasured"] == ["tensor_code", "generated_kernel"]     # host-like has no futuresight.toml entry
    assert "measured no fraction of the bandwidth for products written as tensor_code, generated_kernel" in page
    assert first["kernel_cost_s"] is None and "has no measured cost of a kernel" in page    # nor a kernel's cost
    assert str(escape(tune.DEFAULT_ONLY)) in page and "The order" in page and "the route's profile: " in page

    # Again on the same ledger: every verdict read, no profile, the same route and the same steps.
    route_bytes = (out / "route.json").read_bytes()
    profiles.clear()
    assert main(tune_args(tiny_model, out, ledger, "--processes", "2", "--decisive", "0", "--budget", "2")) == 0
    again = json.loads((out / "tune.json").read_text())
    assert profiles == [] and again["profiles"] == 0
    assert (out / "route.json").read_bytes() == route_bytes
    assert [(s["setting"], s["verdict"], s["ledger_id"], s["after_us"], s["promoted"]) for s in again["steps"]] == \
        [(s["setting"], s["verdict"], s["ledger_id"], s["after_us"], s["promoted"]) for s in first["steps"]]
    assert not any(s["timed"] for s in again["steps"]) and again["order"] == first["order"]
    assert again["final_trace"] == first["final_trace"] and again["final_account"] == first["final_account"]
    with Ledger(ledger, create=False) as led:
        assert len(led.entries()) == len(entries)


def fake_judging(monkeypatch, verdict: str) -> list[str]:
    """Every whole-token profile skipped and every verdict `verdict`, kept in the ledger as the judge keeps it: the
    candidates judged, in order."""
    from types import SimpleNamespace
    from boltbeam.judge.scope import ScopeKey
    timed = []
    monkeypatch.setattr(tune, "profile_route", lambda *a, **k: None)
    monkeypatch.setattr(choose, "profile_route", lambda *a, **k: ("base.json", None))

    def judged(model, device, ledger, candidate, key, *rest):
        timed.append(candidate)
        scope = {**key, ScopeKey.MEDIAN_US: 100.0, ScopeKey.BASELINE_MEDIAN_US: 90.0}
        entry = ledger.append(candidate=candidate, verdict=verdict, reasons=["fake"], scope=scope, evidence=[],
                              reopen=None, actor="test")
        return SimpleNamespace(verdict=verdict, reasons=["fake"]), 90.0, 100.0, entry, (1, 1)
    monkeypatch.setattr(choose, "profile_and_judge", judged)
    return timed


def test_a_later_round_leaves_a_family_others_build_on_as_it_is(tiny_model, tmp_path, monkeypatch):
    """Every setting promoted (faked): the layout of the kernel form joins the route, gemv's geometry goes on it; in the
    second round gemv's next geometry is judged, the layout is not changed under it, and says why."""
    timed = fake_judging(monkeypatch, "promote")
    census, target = take_census(tiny_model), get_target("h200")       # its calibration ranks the kernel form first
    with Ledger(tmp_path / "l.sqlite") as led:
        done, route = tune.tune(tiny_model, census, "CPU", target, 4, 5, led, "sha", tmp_path, [layout.FAMILY,
                                BY_NAME["gemv"]], 2, 10.0)
    assert [(s.family, s.round) for s in done.steps] == [("repacked_layout", 1), ("gemv", 1), ("gemv", 2)]
    assert len(timed) == 3 and route.families["layout"]["form"] == "kernel"
    held = {u.family: u.why for u in done.unjudged}
    assert held["repacked_layout"] == f"{tune.HELD}: gemv builds on it"
    assert held["gemv"].startswith(choose.BEYOND_BUDGET)


def test_rounds_on_a_route_that_did_not_change_are_read_back_in_their_own_rounds(tiny_model, tmp_path, monkeypatch):
    """Nothing promoted, each round judges the family's next best on the same route, so the ledger holds every
    verdict in one scope: a second tune reads each in the round it ran in, times nothing, and writes the same
    steps. Without a budget the rounds go on until every legal setting is judged. (Profiles and verdicts faked:
    what is tested is the order and the ledger.)"""
    timed = fake_judging(monkeypatch, "inconclusive")
    census, target = take_census(tiny_model), get_target("host-like", [CPU_TARGETS])
    ranked = [c.setting.flag for c in choose.foreseen(layout.FAMILY, census, 4, target)[0]]

    def run(budget, ledger):
        timed.clear()
        (tmp_path / ledger).mkdir(exist_ok=True)
        with Ledger(tmp_path / ledger / "l.sqlite") as led:
            done, _ = tune.tune(tiny_model, census, "CPU", target, 4, 5, led, "sha", tmp_path / ledger, [layout.FAMILY],
                                budget, 10.0)
        return done, list(timed)
    first, timed_first = run(2, "two")
    assert [(s.setting, s.round) for s in first.steps] == [(ranked[0], 1), (ranked[1], 2)] and len(timed_first) == 2
    assert [(u.why, u.settings) for u in first.unjudged] == \
        [(f"{choose.BEYOND_BUDGET}: FutureSight kept the 2 best predicted setting(s)", len(ranked) - 2)]
    again, timed_again = run(2, "two")
    assert timed_again == [] and not any(s.timed for s in again.steps)
    assert [(s.setting, s.round, s.ledger_id) for s in again.steps] == [(s.setting, s.round, s.ledger_id) for s in first.steps]
    every, _ = run(None, "every")
    assert [(s.setting, s.round) for s in every.steps] == [(f, r) for r, f in enumerate(ranked, 1)]
    assert every.unjudged == [] and not every.out_of_time


def test_a_later_rounds_setting_keeps_what_the_route_builds_on_and_the_time_beams_step_needs():
    """A layout not of the kernel form is no setting for a route whose gemv geometry builds on the kernel form, and
    later rounds leave a family others on the route build on as it is; the time kept for BEAM's step is a side's processes and its search, each as long as the route's profile took (the
    mean profile of the tune where that recorded no phases)."""
    from types import SimpleNamespace
    from boltbeam.measure.trace import Phases
    from boltbeam.route import gemv
    on = {"layout": layout.Setting("float16", "kernel"), "gemv": gemv.parse("32:4:2:16")}
    assert choose._breaks(layout.FAMILY, on, layout.Setting("float16", "expanded")) == \
        "the route's gemv builds on the layout's generated kernel"
    assert choose._breaks(layout.FAMILY, on, layout.Setting("float32", "kernel", "stacked")) is None
    # Nor does a later round change the layout under the geometries timed on its products: gemv builds on it.
    from boltbeam.route.families import built_on
    assert built_on(layout.FAMILY, on) is gemv.FAMILY and built_on(gemv.FAMILY, on) is None
    assert built_on(layout.FAMILY, {"layout": on["layout"], "constants_once": BY_NAME["constants_once"].from_flag(True)}) is None
    profiled = ("b.json", SimpleNamespace(provenance=SimpleNamespace(phases=Phases(1, 2, 3, 4, 0, 5))))
    assert tune.beam_reserve(profiled, 2, 600.0, 10) == 15 * (2 + tune.BEAM_SEARCH)
    assert tune.beam_reserve(None, 2, 600.0, 10) == 60 * (2 + tune.BEAM_SEARCH)


def test_tune_keeps_to_its_minutes(tiny_model, tmp_path, profiles, capsys):
    """Spent before the first setting: nothing starts, each setting says so, and the route of no family is written."""
    out = tmp_path / "late"
    assert main(tune_args(tiny_model, out, tmp_path / "ledger.sqlite", "--minutes", "0.000001")) == 0
    done = json.loads(capsys.readouterr().out)
    assert profiles == [] and done["profiles"] == 0 and done["out_of_time"] and done["steps"] == []
    assert {u["family"] for u in done["unjudged"] if u["why"] == choose.OUT_OF_TIME} == set(FAMILIES.split(","))
    assert routes.load(str(out / "route.json")).families == {}


def test_with_reference_a_setting_off_llama_cpps_tokens_is_not_promoted(tiny_model, tmp_path, profiles, monkeypatch,
                                                                         capsys):
    """--reference: llama.cpp's greedy tokens (the stand-in binding's, always 3) decoded once on the same prompt ids;
    the layout's setting, which keeps the tiny model's own tokens, is refuted on them and the route stays tinygrad's
    own; tune.json, the ledger, the page and the output say what the output was held to. The route written
    (tinygrad's own here) is accounted from its profile."""
    with_fakes(monkeypatch)
    out, ledger = tmp_path / "held", tmp_path / "ledger.sqlite"
    args = tune_args(tiny_model, out, ledger, "--reference")
    args[args.index(FAMILIES)] = "repacked_layout"
    assert main(args) == 0
    done = json.loads(capsys.readouterr().out)
    reference = done["reference"]
    assert "llama.cpp" in reference["engine"] and set(reference["output_tokens"]) == {3}
    assert done["checked_against"] == f"checked against {reference['engine']}'s greedy tokens on the same prompt ids"
    [step] = [s for s in done["steps"] if s["verdict"]]
    assert step["verdict"] == "refute" and not step["promoted"] and len(profiles) == 2
    assert step["reasons"][0].startswith("the output is not the reference's") and "where" in step["reasons"][0]
    assert done["start_output"].startswith("the output is not the reference's")    # tinygrad's own route, profiled
    assert routes.load(str(out / "route.json")).families == {}
    with Ledger(ledger, create=False) as led:
        assert led.entries()[0].scope["reference"] == reference
    assert reference["engine"] in (out / "report.html").read_text()
    assert done["final_trace"] == profiles[0] and done["final_account"]["wall_us"] > 0 and done["beside"] is None


def test_compare_puts_llama_cpps_token_beside_the_journey(tiny_model, tmp_path, monkeypatch, capsys):
    """--compare llama.cpp: the binding's token at the tune's depth and tokens, profiled in a process of its own (a
    CUDA device: llama.cpp's kernels are timed through CUPTI, the stand-ins' here), its median plain token drawn
    beside the journey; on a CPU, one line before anything is written."""
    from boltbeam.report.page import render_tune
    with_fakes(monkeypatch)
    one_line(capsys, 2, main(tune_args(tiny_model, tmp_path / "cpu", tmp_path / "l.sqlite", "--compare", "llama.cpp")))
    assert not (tmp_path / "cpu").exists() and not (tmp_path / "l.sqlite").exists()
    beside = tune.beside("llama.cpp", tiny_model, "CUDA", 4, 5, tmp_path)
    trace = tracefile.load(beside.trace)
    assert beside.why is None and trace.route.label.startswith("llama.cpp") and trace.workload.context == 4
    assert beside.median_us == median(trace.token_wall_us) and len(trace.token_wall_us) == 5
    done = tune.Tune(tiny_model, "sha", "CUDA", "h200", 4, 5, 1.0, start_us=4 * beside.median_us,
                     final_us=beside.median_us / 2, beside=beside)
    page = render_tune(done)
    assert "llama.cpp, beside" in page and f"{beside.median_us:,.1f} µs a token" in page and "2.00x as fast" in page
    monkeypatch.setenv("FAKE_LLAMA_LOAD", "fail")        # a file llama.cpp cannot load: said, not raised
    assert "llama.cpp cannot load" in tune.beside("llama.cpp", tiny_model, "CUDA", 4, 5, tmp_path / "bad").why


def test_the_order_runs_first_the_family_predicted_to_save_most(tiny_model):
    """Where the route runs a setting of a family, FutureSight predicts what its best saves against it, and that
    family goes before one not priced (no profile of the route here) that spaces.toml puts first; with none priced,
    spaces.toml's."""
    target = get_target("host-like", [CPU_TARGETS])
    census = take_census(tiny_model)
    split, once = BY_NAME["split_attention"], BY_NAME["constants_once"]
    start = Route("x", engine(), "CPU", target.name, "tune", "generated by search", [])
    candidates, _ = choose.foreseen(split, census, 4, target, ("r", start))
    on = ("r", choose.with_setting(split, start, candidates[-1].setting, "x", "CPU", target.name, 0))
    outlooks = {f.name: tune.outlook(f, census, 4, target, on, None) for f in (once, split)}
    assert outlooks["constants_once"].gain_us is None and tune.NO_PROFILE in outlooks["constants_once"].why
    assert outlooks["split_attention"].against == tune.ROUTE_SETTING
    assert outlooks["split_attention"].against_us == pytest.approx(candidates[-1].predicted_us)
    assert outlooks["split_attention"].gain_us == pytest.approx(candidates[-1].predicted_us - candidates[0].predicted_us)
    gains = {name: o.gain_us for name, o in outlooks.items()}
    assert gains["split_attention"] > 0 and tune.first_of([once, split], gains) is split
    assert tune.first_of([once, split], {"constants_once": None, "split_attention": None}) is once
    assert tune.first_of([once, split], {"constants_once": None, "split_attention": -1.0}) is once


def test_a_family_the_route_does_not_set_is_priced_from_the_routes_profile(tiny_model, tiny_default):
    """On a route of no family, each family's saving is the time the route's profile spends in what the family
    declares it replaces (account's regions, kernel categories, the host's step) less FutureSight's best setting's
    prediction, and the order follows those savings, not spaces.toml's."""
    target = get_target("host-like", [CPU_TARGETS])
    census = take_census(tiny_model)
    profile = tracefile.load(tiny_default.path)
    tokens = list(profile.by_token().values())
    # The host's step made the longest part of the token: the family spaces.toml puts last here should go first.
    profile.kernel_pass.plain_host_us = [2 * max(sum(k.duration_us for k in ks) for ks in tokens)] * 5
    on = ("r", Route("x", engine(), "CPU", target.name, "tune", "generated by search", []))
    ready = [f for f in tune.tunable() if f.needs is None]     # what a route of no family can take
    regions = region_times(profile)
    spent = {f.name: sum(regions[r] for r in f.replaces.regions)
             + sum(median(sum(k.duration_us for k in ks if k.category == c) for ks in tokens) for c in f.replaces.categories)
             + (median(profile.kernel_pass.plain_host_us) if f.replaces.host else 0.0) for f in ready}
    assert spent["split_attention"] == regions["attention"] > 0 and spent["constants_once"] > 0
    saving = {}
    for f in ready:
        o, best = tune.outlook(f, census, 4, target, on, profile), choose.foreseen(f, census, 4, target, on)[0][0]
        assert (o.against, o.best, o.best_us) == (tune.PROFILE, best.flag, best.predicted_us)
        assert o.against_us == pytest.approx(spent[f.name]) and sum(o.replaced_us.values()) == pytest.approx(o.against_us)
        assert o.gain_us == pytest.approx(spent[f.name] - best.predicted_us)
        saving[f.name] = o.gain_us
    order, left = [], list(ready)
    while left:
        order.append(tune.first_of(left, saving))
        left.remove(order[-1])
    expected = sorted((n for n in saving if saving[n] > 0), key=lambda n: -saving[n])
    assert [f.name for f in order] == expected + [f.name for f in ready if f.name not in expected]
    assert order[0] is BY_NAME["direct_replay"] is not ready[0]
    # Not recorded, not priced: no host step in the profile, or no profile at all.
    profile.kernel_pass.plain_host_us = None
    assert tune.outlook(BY_NAME["direct_replay"], census, 4, target, on, profile).gain_us is None
    assert tune.NO_PROFILE in tune.outlook(ready[0], census, 4, target, on, None).why


def test_a_family_the_route_cannot_take_is_skipped_with_its_reason(tiny_model, tmp_path, profiles, capsys):
    """gemv builds on the layout's generated kernel: on a route without it, skipped and recorded, nothing run."""
    out = tmp_path / "gemv"
    args = tune_args(tiny_model, out, tmp_path / "ledger.sqlite")
    args[args.index(FAMILIES)] = "gemv,fusion"
    assert main(args) == 0
    done = json.loads(capsys.readouterr().out)
    assert profiles == [] and done["steps"] == []
    assert [s["family"] for s in done["skipped"]] == ["gemv", "fusion"]
    assert all("layout's generated kernel" in s["why"] for s in done["skipped"])


@pytest.mark.parametrize("change, says", [
    (["--minutes", "0"], "--minutes above 0"),
    (["--tokens", "4"], "--tokens >= 5"),
    (["--alone", "-1"], "--alone >= 0"),
    (["--seconds-per-kernel", "0"], "--seconds-per-kernel above 0"),
    (["--beam", "-1"], "--beam >= 0"),
    (["--processes", "0"], "--processes >= 1"),
    (["--processes", "2", "--workers", "3"], "--workers from 1 to --processes"),
    (["--processes", "2", "--workers", "2"], "on CPU they would share the cores"),
    (["--decisive", "-1"], "--decisive from 0 to 100"),
    (["--decisive", "101"], "--decisive from 0 to 100"),
    (["--families", "repacked_layout,nope"], "unknown nope"),
    (["--target", "nope"], "unknown target 'nope'"),
    (["--reference"], "needs llama-cpp-python"),      # no binding here (the stand-in is not on the path)
])
def test_bad_input_is_one_line_and_writes_nothing(tiny_model, tmp_path, change, says, capsys):
    out = tmp_path / "out"
    one_line(capsys, 2, main(tune_args(tiny_model, out, tmp_path / "l.sqlite") + change), says)
    assert not out.exists() and not (tmp_path / "l.sqlite").exists()


def test_no_model_and_an_input_as_out_are_one_line(tiny_model, tmp_path, capsys):
    one_line(capsys, 2, main(tune_args(str(tmp_path / "none.gguf"), tmp_path / "o", tmp_path / "l")), "no such file")
    one_line(capsys, 2, main(tune_args(tiny_model, tiny_model, tmp_path / "l")), "not a folder")
    assert not (tmp_path / "o").exists() and not (tmp_path / "l").exists()


def test_tune_times_gemvs_products_alone_and_no_other_family(tiny_model, tmp_path, monkeypatch):
    """With --alone, tune hands the per-product timing (its count and seconds) to gemv's search and to no other
    family: on the 8B shape one geometry for every product left gate+up 41% and qkv 48% slower than a geometry for
    each (bench/h200/s18)."""
    from boltbeam.route import gemv
    from tests.test_gemv import kernel_route
    threads, on = kernel_route(tiny_model, tmp_path)
    target = get_target("cpu-with-groups", [str(threads)])
    calls = []

    def judged(family, *args, alone=None, seconds=None, **kwargs):
        calls.append((family.name, alone, seconds))
        if family.name != "repacked_layout":
            return choose.Choice(family.name, 1.0, [], None)
        c = choose.Candidate(layout.Setting(**on.families["layout"]), 0, 0, 1.0, verdict="promote")
        c.median_us = 1.0
        return choose.Choice(family.name, 2.0, [c], c)
    monkeypatch.setattr(tune, "choose", judged)
    monkeypatch.setattr(tune, "profile_route", lambda *args: None)    # no baseline: the families keep their order
    with Ledger(tmp_path / "l.sqlite") as ledger:
        tune.tune(tiny_model, take_census(tiny_model), "CPU", target, 4, 5, ledger, on.model_sha256, tmp_path / "t",
                  [BY_NAME["repacked_layout"], BY_NAME["gemv"]], 1, 1.0, alone=3, seconds=2.0)
    assert calls == [("repacked_layout", None, 2.0), (gemv.FAMILY.name, 3, 2.0)]


def test_a_second_run_reads_gemvs_products_from_the_ledger_and_times_none_alone(tiny_model, tmp_path, monkeypatch):
    """The geometry for each product that the ledger judged in this scope is read back: no product is timed alone
    again (whose times could choose another setting and so judge again), no token is profiled, its verdict stands."""
    from boltbeam.judge.scope import ScopeKey
    from boltbeam.route import gemv
    from boltbeam.search import alone
    from tests.test_gemv import kernel_route
    threads, on = kernel_route(tiny_model, tmp_path)
    target, census = get_target("cpu-with-groups", [str(threads)]), take_census(tiny_model)
    legal = choose.space(gemv.FAMILY, target)[0]
    setting = gemv.PerProduct(tuple(
        (gemv.product_key(s.planes()), [g for g in legal if g.divides(s.planes())][-1])
        for s in alone.shapes(census, layout.Setting(**on.families["layout"]))))
    scope = choose.FamilyScope(choose.TokenScope(on.model_sha256, "CPU", engine(), 0, 4, 5, choose.route_settings(on)),
                               target.name, gemv.FAMILY.name, choose.label_of(on, 0), None)

    def never(*args, **kwargs):
        raise AssertionError("timed or profiled again")
    monkeypatch.setattr(choose.alone_timing, "time_products", never)
    monkeypatch.setattr(choose, "profile_elsewhere", never)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        for flag, verdict in ((setting.flag, "promote"), (legal[0].flag, "refute")):   # the newest: one geometry
            ledger.append(candidate=f"{gemv.FAMILY.name} {flag}", verdict=verdict, reasons=["judged before"],
                          scope={**scope.of(flag), ScopeKey.PREDICTED_US: 7.0, ScopeKey.MEDIAN_US: 5.0}, evidence=[],
                          reopen="engine != test", actor="test")
        done = choose.choose(gemv.FAMILY, tiny_model, census, "CPU", 4, 5, target, ledger, on.model_sha256, tmp_path,
                             budget=1, on=(str(tmp_path / "on.json"), on), recall=True, alone=2)
    first = done.candidates[0]
    assert first.flag == setting.flag and first.recalled and first.verdict == "promote" and first.ledger_id == 1
    assert first.predicted_us == 7.0 and done.chosen is first and done.alone == []
    # Past the deadline nothing is timed alone either (the products' timing would be thrown away).
    with Ledger(tmp_path / "empty.sqlite") as ledger:
        late = choose.choose(gemv.FAMILY, tiny_model, census, "CPU", 4, 5, target, ledger, on.model_sha256, tmp_path,
                             budget=1, on=(str(tmp_path / "on.json"), on), recall=True, alone=2, deadline=0.0)
    assert late.alone == [] and all(c.skipped for c in late.candidates)


def test_a_verdict_on_one_process_a_side_is_not_read_as_one_on_two():
    """The scope's processes: null for one (as a ledger older than the key reads), the count above one; a verdict
    judged on two processes a side answers only a run on two, and an old one only a run on one."""
    from boltbeam.ledger.store import scope_matches
    one, two = (choose.TokenScope("s", "CPU", "e", 0, 4, 5, None, p).as_json() for p in (1, 2))
    old = {k: v for k, v in one.items() if k != "processes"}
    assert scope_matches(two, two) and not scope_matches(two, one) and not scope_matches(one, two)
    assert scope_matches(old, one) and not scope_matches(old, two)


def test_beam_is_the_last_step_and_a_promoted_route_carries_what_it_chose(tiny_model, tmp_path, profiles, capsys,
                                                                         monkeypatch):
    """--beam W: after the families, the route so far with tinygrad's BEAM at W for the kernels the families leave to
    it, judged like a setting and kept in the ledger; promoted, the route carries the kernels as that run compiled them
    (a load searches nothing), else it stays as it was. A second tune reads the verdict and profiles nothing.
    Two processes a side, where no first pair settles a verdict (settled, tested above, held false): the route of no
    family is profiled in one process, and its second runs, on its own route, only once the first family's first pair
    is close."""
    import subprocess
    import sys
    from tests.test_route_choices import PROFILE

    def narrowed(model, device, out, *flags, gpu=None):     # each profile as tune runs it, BEAM's actions narrowed (seconds)
        profiles.append(out)
        done = subprocess.run([sys.executable, "-c", PROFILE, "profile", model, "--device", device, "--out", out,
                               "--json", *flags], capture_output=True, text=True)
        return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]
    monkeypatch.setattr(choose, "profile_elsewhere", narrowed)
    monkeypatch.setattr(choose, "settled", lambda *args: False)
    out, ledger = tmp_path / "tuned", tmp_path / "ledger.sqlite"
    args = tune_args(tiny_model, out, ledger, "--beam", "1", "--processes", "2")
    args[args.index("--families") + 1] = "constants_once"
    assert main(args) == 0
    done = json.loads(capsys.readouterr().out)
    last = done["steps"][-1]
    assert last["family"] == tune.BEAM_STEP and last["setting"] == "width=1" and last["predicted_us"] is None
    assert last["verdict"] in VERDICTS and last["timed"] and last["before_us"] > 0 and last["after_us"] > 0
    traces, once = out / "traces", out / "traces" / "1_constants_once" / "constants_once_once"
    assert profiles == [str(traces / "route.trace.json"), f"{once}.json", str(traces / "route.trace.p2.json"),
                        f"{once}.p2.json", str(traces / "2_beam" / "beam_1.json"), str(traces / "2_beam" / "beam_1.p2.json")]
    assert [s["sides"] for s in done["steps"]] == [[2, 2], [2, 2]] and done["decisive"] == 0.1
    assert tracefile.load(profiles[2]).route == tracefile.load(profiles[0]).route     # the baseline's own route again
    with Ledger(ledger, create=False) as led:
        entry = led.entries()[-1]
    assert (entry.id, entry.candidate, entry.verdict) == (last["ledger_id"], "beam width=1", last["verdict"])
    assert entry.scope["decisive"] == 0.1 and len(entry.evidence) == 4
    route = routes.load(str(out / "route.json"))
    before = done["steps"][-2]
    assert ("constants_once" in route.families) == before["promoted"]
    if last["promoted"]:
        assert route.beam == 1 and route.compiled and route.load_beam() == 0 and done["final_us"] == last["after_us"]
    else:
        assert route.beam == 0 and not route.compiled
    # The route written is accounted from its own profile: BEAM's run where BEAM joined it, else the route before.
    assert done["final_trace"] == (profiles[4] if last["promoted"] else profiles[1] if before["promoted"] else profiles[0])
    route_bytes = (out / "route.json").read_bytes()
    profiles.clear()
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert profiles == [] and (out / "route.json").read_bytes() == route_bytes
    assert again["final_trace"] == done["final_trace"]
    assert [(s["setting"], s["verdict"], s["timed"]) for s in again["steps"]][-1] == ("width=1", last["verdict"], False)
    assert [s["sides"] for s in again["steps"]] == [[2, 2], [2, 2]]       # read back from the ledger's evidence


def test_workers_run_a_sides_processes_at_once_each_on_a_gpu_of_its_own(monkeypatch, tmp_path):
    """--workers 2: both processes of a side start before either ends (a barrier both must reach), on the GPUs that
    CUDA_VISIBLE_DEVICES names, one each; the child process is given its GPU alone."""
    import subprocess
    import threading
    from boltbeam.measure import tinygrad_run
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    both, placed, ran = threading.Barrier(2, timeout=20), [], []

    def at_once(model, device, out, *flags, gpu=None):
        both.wait()     # a side profiled one process after the other never gets past this
        placed.append((out, gpu))
    monkeypatch.setattr(choose, "profile_elsewhere", at_once)
    choose.profile_side("m.gguf", "CUDA", str(tmp_path / "b.json"), 2, lambda: ran.append(1), "the baseline",
                        workers=2)
    assert sorted(placed) == [(str(tmp_path / "b.json"), "5"), (str(tmp_path / "b.p2.json"), "7")] and len(ran) == 2
    seen = []
    monkeypatch.setattr(tinygrad_run.subprocess, "run", lambda cmd, **kw: seen.append(kw["env"]) or
                        subprocess.CompletedProcess(cmd, 0))
    assert tinygrad_run.profile_elsewhere("m.gguf", "CUDA", "o.json", gpu="7") is None
    assert tinygrad_run.profile_elsewhere("m.gguf", "CUDA", "o.json") is None
    assert seen[0]["CUDA_VISIBLE_DEVICES"] == "7" and seen[1] is None      # one process alone inherits ours


def test_workers_never_share_a_gpu_and_start_nothing_after_a_failure(monkeypatch, tmp_path):
    """More processes than GPUs: a GPU takes its next process only when its last has ended. A failed process is
    refused in one line, and no process starts after it."""
    import threading
    import time
    from boltbeam.errors import BadInput, Refused
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lock, busy, started = threading.Lock(), set(), []

    def one_a_gpu(model, device, out, *flags, gpu=None):
        with lock:
            assert gpu not in busy, f"two processes on GPU {gpu}"
            busy.add(gpu)
            started.append(out)
        time.sleep(0.05 if out.endswith("p2.json") else 0.2)     # the second GPU's first ends first
        with lock:
            busy.discard(gpu)
        return "out of memory" if fail and out.endswith(fail) else None
    monkeypatch.setattr(choose, "profile_elsewhere", one_a_gpu)
    fail, ran = None, []
    choose.profile_side("m.gguf", "CUDA", str(tmp_path / "b.json"), 5, lambda: ran.append(1), "the baseline",
                        workers=2)
    assert len(started) == len(ran) == 5
    fail, started = "b.p2.json", []
    with pytest.raises(Refused, match="profiling the baseline failed: out of memory"):
        choose.profile_side("m.gguf", "CUDA", str(tmp_path / "b.json"), 5, lambda: None, "the baseline", workers=2)
    assert sorted(started) == [str(tmp_path / "b.json"), str(tmp_path / "b.p2.json")]    # nothing after the failure
    for visible, says in (("5,7", "names 2"), ("5,5,7", "names 2"), ("", "names 0"), ("-1,0,1", "names 2")):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        with pytest.raises(BadInput, match=says):
            choose.gpus(3)


def test_a_first_pair_past_the_decisive_change_settles_the_verdict(monkeypatch, tmp_path):
    """With --decisive, a candidate's first process runs against the baseline's first: a change of at least that much,
    or an inconclusive pair (more pairs could not make it promote), is judged on them, and nothing else runs; a closer
    one runs the baseline's other processes (with the baseline's own flags) and the candidate's before its verdict.
    Off (0), every process runs. A side made anew keeps no process file an earlier run left; the ledger's evidence
    tells each side's processes, and the times are each side's median over them."""
    from tests.test_judge import SEARCH, baseline, make_trace, noisy
    medians, profiled = {}, []

    def fake(model, device, out, *flags, gpu=None):
        name = out.rsplit("/", 1)[1]
        profiled.append((name, flags[-1]))
        trace = baseline if name.startswith("b") else make_trace
        tracefile.save(trace(noisy(medians[name], seed=len(profiled))), out)
    monkeypatch.setattr(choose, "profile_elsewhere", fake)

    def verdict(candidate_us: float, decisive: float, folder: str):
        (tmp_path / folder).mkdir(exist_ok=True)
        b, c = str(tmp_path / folder / "b.json"), str(tmp_path / folder / "c.json")
        medians.update({"b.json": 1000, "b.p2.json": 1010, "c.json": candidate_us, "c.p2.json": candidate_us})
        tracefile.save(baseline(noisy(1000, seed=0)), b)      # the baseline's first process, profiled earlier
        profiled.clear()
        with Ledger(tmp_path / folder / "ledger.sqlite") as ledger:
            j, before, after, ledger_id, sides = choose.profile_and_judge(
                "m.gguf", "CPU", ledger, "fam x", {}, choose.Side(b, ("--route", "none")),
                choose.Side(c, ("--route", "r.json")), 2, 1, decisive, SEARCH, None, "test", lambda: None, "fam x")
            entry = ledger.entries()[-1]
        assert entry.id == ledger_id and len(entry.evidence) == sum(sides) and choose.sides_of(entry.evidence) == sides
        assert before == choose.pooled_median(choose.side(b, 2)) and after == choose.pooled_median(choose.side(c, 2))
        return j.verdict, sides, list(profiled)
    (tmp_path / "far").mkdir()
    tracefile.save(make_trace(noisy(1000, seed=9)), str(tmp_path / "far" / "c.p2.json"))     # an earlier run's
    assert verdict(700, 0.1, "far") == ("promote", (1, 1), [("c.json", "r.json")])
    assert not (tmp_path / "far" / "c.p2.json").exists()       # a side made anew keeps no earlier run's process
    assert verdict(1000, 0.1, "level") == ("inconclusive", (1, 1), [("c.json", "r.json")])    # more could not promote
    assert verdict(950, 0.1, "close") == ("promote", (2, 2), [("c.json", "r.json"), ("b.p2.json", "none"),
                                                              ("c.p2.json", "r.json")])
    assert verdict(700, 0.0, "off") == ("promote", (2, 2), [("c.json", "r.json"), ("c.p2.json", "r.json"),
                                                            ("b.p2.json", "none")])
    # A verdict settled on its first processes answers only a run under the same rule, and one judged on every
    # process (or an older ledger's) only a run without it.
    from boltbeam.ledger.store import scope_matches
    every, settled = (choose.TokenScope("s", "CPU", "e", 0, 4, 5, None, 2, d).as_json() for d in (0.0, 0.1))
    old = {k: v for k, v in every.items() if k != "decisive"}
    assert not scope_matches(settled, every) and not scope_matches(every, settled) and scope_matches(old, every)
    assert not scope_matches(old, settled)


def test_an_earlier_tunes_baseline_serves_only_with_every_process(monkeypatch, tmp_path):
    """A baseline read from the ledger that lies outside this tune's folder, judged on fewer processes than asked,
    is not used (its other processes would be profiled beside it, in the other folder); whole, or inside, it is."""
    from tests.test_judge import baseline, noisy
    monkeypatch.setattr(tune, "baseline_of", lambda path, *rest: "read")
    out, other = tmp_path / "out", tmp_path / "other"
    for folder in (out, other):
        folder.mkdir()
        tracefile.save(baseline(noisy(1000)), str(folder / "b.json"))
    earlier = lambda folder: tune._earlier(str(folder / "b.json"), "s", "CPU", 4, None, out, 2)
    assert earlier(other) is None and earlier(out) == (str(out / "b.json"), "read")
    tracefile.save(baseline(noisy(1000)), str(other / "b.p2.json"))
    assert earlier(other) == (str(other / "b.json"), "read")
