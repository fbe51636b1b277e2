"""The promote gate's "output still correct" against a reference engine's greedy tokens where the checks (or
`judge --reference`) carry them, and the judgement saying what the output was held to either way."""
from __future__ import annotations

import dataclasses
import json

import pytest
from test_judge import CHECKS, TOKENS, baseline, faster_candidate, make_trace, noisy

from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.judge.judge import FAIL, PASS, Checks, judge, with_reference
from boltbeam.judge.verdicts import PROMOTE, REFUTE
from boltbeam.measure.trace import save

ENGINE = "llama.cpp"
# The reference decoded fewer steps than the routes, and differs from them from step 3 on.
WRONG = TOKENS[:3] + [t + 1 for t in TOKENS[3:20]]


def held_to(tokens: list[int], checks: Checks = CHECKS) -> Checks:
    return dataclasses.replace(checks, reference_tokens=tokens, reference_engine=ENGINE)


def test_a_route_that_agrees_with_its_baseline_but_not_the_reference_is_refuted():
    j = judge(baseline(), faster_candidate(), held_to(WRONG))
    assert j.verdict == REFUTE and j.gates["correct"].status == FAIL
    assert j.checked_against == f"reference engine {ENGINE}"
    assert j.reasons == [j.gates["correct"].sentence]
    assert "17 of the 20 greedy tokens both decoded differ from reference engine llama.cpp's" in j.reasons[0]
    assert f"the first at step 3: {TOKENS[3]} where llama.cpp gives {TOKENS[3] + 1}" in j.reasons[0]
    assert ENGINE in j.reopen and j.to_dict()["checked_against"] == j.checked_against


def test_tokens_equal_over_the_steps_both_decoded_promote():
    j = judge(baseline(), faster_candidate(), held_to(TOKENS[:20]))
    assert j.verdict == PROMOTE and j.gates["correct"].status == PASS
    assert "0 of the 20 greedy tokens both decoded differ from reference engine llama.cpp's" in j.reasons[0]
    # the baseline's own tokens no longer decide: a baseline that is wrong does not fail a right candidate
    j = judge(baseline(tokens=[t + 1 for t in TOKENS]), faster_candidate(), held_to(TOKENS[:20]))
    assert j.verdict == PROMOTE


def test_without_a_reference_the_verdict_says_the_baseline_was_all():
    j = judge(baseline(), faster_candidate(), CHECKS)
    assert j.verdict == PROMOTE and j.checked_against.startswith("the baseline's route only (")
    assert "no reference engine" in j.gates["correct"].sentence and j.gates["correct"].sentence in j.reasons


@pytest.mark.parametrize("raw, said", [
    ({"reference_tokens": [1, 2]}, "go together"),
    ({"reference_engine": ENGINE}, "go together"),
    ({"reference_tokens": [], "reference_engine": ENGINE}, "non-empty list of token ids"),
    ({"reference_tokens": [1, -2], "reference_engine": ENGINE}, "non-empty list of token ids"),
    ({"reference_tokens": [1, True], "reference_engine": ENGINE}, "non-empty list of token ids"),
])
def test_a_reference_in_the_checks_is_whole(raw, said):
    with pytest.raises(BadInput, match=said):
        Checks.from_dict(raw)


def reference_trace(tokens: list[int], **kw):
    t = make_trace(noisy(800, seed=5), tokens=tokens, **kw)
    t.environment.engine = ENGINE
    return t


def test_a_reference_trace_must_be_the_same_model_and_prompt():
    cands = [faster_candidate()]
    checks = with_reference(CHECKS, reference_trace(WRONG), cands, "r.json")
    assert checks.reference_tokens == WRONG and checks.reference_engine == ENGINE
    for ref, said in ((reference_trace(WRONG, model="cd" * 32), "model_sha256"),
                      (reference_trace(WRONG, context=64), "context"),
                      (reference_trace(None), "no output tokens")):
        with pytest.raises(BadInput, match=said):
            with_reference(CHECKS, ref, cands, "r.json")


def test_judge_reference_from_the_command_line(tmp_path, capsys):
    paths = {}
    for name, t in (("a", baseline()), ("b", faster_candidate()), ("ref", reference_trace(WRONG)),
                    ("other", reference_trace(WRONG, context=64))):
        save(t, str(tmp_path / f"{name}.json"))
        paths[name] = str(tmp_path / f"{name}.json")
    (tmp_path / "checks.json").write_text(json.dumps({"expected_route": CHECKS.expected_route}))
    argv = ["judge", "--baseline", paths["a"], "--candidate", paths["b"], "--checks", str(tmp_path / "checks.json")]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == PROMOTE
    assert main([*argv, "--reference", paths["ref"]]) == 0
    out = capsys.readouterr().out
    assert REFUTE in out and "output checked against reference engine llama.cpp" in out
    assert main([*argv, "--reference", paths["other"]]) == 2
    assert "not the same model and prompt" in capsys.readouterr().err


def test_the_audit_page_says_what_the_output_was_checked_against(tiny_model):
    from test_account import H200L
    from test_report import closing_trace

    from boltbeam.bound.roofline import bound
    from boltbeam.read.census import take_census
    from boltbeam.report.audit import assemble
    from boltbeam.report.page import render
    b = bound(take_census(tiny_model), H200L, context=0, batch=1)
    route, ref = closing_trace(b, sha="ab" * 32), closing_trace(b, sha="ab" * 32)
    route.output_tokens, ref.output_tokens, ref.environment.engine = TOKENS, WRONG, ENGINE
    alone = assemble(route, "t.json", tiny_model, H200L, b, None)
    assert alone.output is None and alone.to_dict()["output_reference"] is None   # (its page: test_unread's audit)
    held = assemble(route, "t.json", tiny_model, H200L, b, None, [("ref.json", ref)])
    assert (held.output.engine, held.output.status) == (ENGINE, FAIL)
    assert held.to_dict()["output_reference"]["sentence"] == held.output.sentence
    html = render(held)
    assert "checked against reference engine llama.cpp (ref.json)" in html and "17 of the 20 greedy tokens" in html
    ref.workload.context = 64                               # another prompt is no reference
    assert assemble(route, "t.json", tiny_model, H200L, b, None, [("ref.json", ref)]).output is None
