"""A scope's keys are named once (judge/scope.py) and the records that build scopes store what the literal dicts
stored before, so an old ledger's entries are still found, read back and skipped on."""
from __future__ import annotations

import dataclasses

from boltbeam.judge.scope import JudgedScope, ScopeKey
from boltbeam.ledger import reopen
from boltbeam.ledger.store import Ledger, scope_matches
from boltbeam.search import choose, decide

ENGINE = "tinygrad 0.13.0"
# Scopes as the code spelled them before ScopeKey: a kernel search's setting, a whole token's run, a family's setting.
OLD_KERNEL = {"device": "CPU", "target": "host-like", "engine": ENGINE, "family": "tinygrad_opts", "reps": 5,
              "kernel": "k1", "setting": "local=4"}
OLD_TOKEN = {"device": "CPU", "engine": ENGINE, "model_sha256": "ab" * 32, "beam": 0, "context": 64, "tokens": 8,
             "route": None}
OLD_FAMILY = {**OLD_TOKEN, "target": "host-like", "family": "split_attention", "on": "tinygrad-scheduler",
              "reference": {"engine": "llama.cpp", "output_tokens": [1, 2]}, "setting": "splits=4"}
OLD_JUDGED = {"model_sha256": "ab" * 32, "target": "CPU", "workload": {"context": 64, "batch": 1},
              "compiler": "tinygrad", "compiler_version": "0.13.0"}

KERNEL = decide.Scope("CPU", "host-like", ENGINE, "tinygrad_opts")
TOKEN = choose.TokenScope("ab" * 32, "CPU", ENGINE, 0, 64, 8, None)
FAMILY = choose.FamilyScope(TOKEN, "host-like", "split_attention", "tinygrad-scheduler",
                            choose.Reference("llama.cpp", [1, 2]))


def test_the_records_store_the_keys_the_literal_dicts_stored():
    assert JudgedScope("ab" * 32, "CPU", 64, 1, "tinygrad", "0.13.0").as_json() == OLD_JUDGED
    assert KERNEL.timed("k1", "r_4", "local=4", 2.5) == {**OLD_KERNEL, "measured_us": 2.5, "kernel_name": "r_4"}
    assert KERNEL.timed("k1", "r_4", "local=4", "too many locals") == {**OLD_KERNEL, "refused": "too many locals",
                                                                       "kernel_name": "r_4"}
    # The keys added since: processes and decisive, null for one process a side (an old entry, lacking them, reads
    # as null).
    added = {ScopeKey.PROCESSES: None, ScopeKey.DECISIVE: None}
    assert TOKEN.as_json() == {**OLD_TOKEN, **added}
    assert FAMILY.of("splits=4") == {**OLD_FAMILY, **added}
    assert reopen.unless(ScopeKey.ENGINE, ENGINE) == f"engine!={ENGINE}"


def test_scope_matches_compares_the_canonical_spelling():
    stored = {**OLD_TOKEN, "median_us": 110.0}
    assert scope_matches(stored, TOKEN.as_json())
    assert not scope_matches(stored, TOKEN.as_json() | {ScopeKey.TOKENS: "8"})   # text is not the number
    assert scope_matches(stored, {ScopeKey.REFERENCE: None})                      # a key it lacks holds null
    assert not scope_matches(stored, {ScopeKey.BEAM: None})


def test_an_old_ledgers_entries_are_found_by_the_records(tmp_path):
    with Ledger(tmp_path / "old.sqlite") as led:
        led.append(candidate="k1:default", verdict="diagnostic", reasons=["timed"],
                   scope={**OLD_KERNEL, "setting": "default", "measured_us": 3.0, "kernel_name": "r_4"},
                   evidence=[], reopen=None, actor="boltbeam search")
        led.append(candidate="k1:local=4", verdict="refute", reasons=["too many locals"],
                   scope={**OLD_KERNEL, "refused": "too many locals", "kernel_name": "r_4"}, evidence=[],
                   reopen=f"engine!={ENGINE}", actor="boltbeam search")
        led.append(candidate="split_attention splits=4", verdict="refute", reasons=["slower"],
                   scope={**OLD_JUDGED, **OLD_FAMILY, "predicted_us": 90.0, "median_us": 110.0,
                          "baseline_median_us": 100.0},
                   evidence=[], reopen=f"engine!={ENGINE}", actor="boltbeam search")

        settings = [{"local": 4}, {"local": 8}]
        assert decide.known_times(led, KERNEL, "k1", settings) == {"default": 3.0, "local=4": "too many locals"}
        assert decide.known_times(led, dataclasses.replace(KERNEL, reps=3), "k1", settings) == {}

        e = choose.recalled(led, "split_attention splits=4", FAMILY.of("splits=4"))
        assert e is not None and e.scope[ScopeKey.MEDIAN_US] == 110.0 and e.scope[ScopeKey.BASELINE_MEDIAN_US] == 100.0
        assert scope_matches(e.scope, TOKEN.as_json())
        assert choose.recalled(led, "split_attention splits=4", dataclasses.replace(FAMILY, reference=None)
                               .of("splits=4")) is None

        assert led.should_skip("split_attention splits=4", FAMILY.of("splits=4"))[0]
        elsewhere = dataclasses.replace(FAMILY, token=dataclasses.replace(TOKEN, engine="tinygrad 0.14.0"))
        assert not led.should_skip("split_attention splits=4", elsewhere.of("splits=4"))[0]
