"""Hostile input, round four (issue 35, item 4): the holes the seeded campaign of bench/hostile4_campaign.py
found past round three, each refused at its root, in one line, exit 2, nothing written."""
import gzip
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltbeam.cli import one_line
from boltbeam.errors import BadInput
from boltbeam.files import load_json
from test_hostile3 import main, trace_doc
from test_hostile3 import one_line as said_once

FEW = settings(max_examples=40, derandomize=True, deadline=None, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])


def search_summary(**kernel) -> dict:
    return {"route": "r.json", "seconds": 1.0, "space": {"settings": 3, "legal": 2, "survivors": 1},
            "timed_now": 1, "routed_kernels": 1, "search_space_incomplete": [],
            "per_kernel": [{"kernel": "ab" * 12, "name": "k", "launches": 1, "legal": 2, "settings": 3, "survivors": 1,
                            "timed": 1, "default_us": 2.0, "best_us": 1.0, "floor_us": 0.5, "choice": None,
                            "outputs": 8, **kernel}]}


# --- every JSON a user hands in: its numbers convert to finite floats, whichever reader takes them ---

HUGE = {"an integer of 310 digits": 10 ** 309, "1e999": "1e999", "-1E+400": "-1E+400", "2e0308": "2e0308"}


def dumped(doc) -> str:
    """JSON text where a string value 'NUMBER:x' stands for the bare number x (json.dumps writes no 1e999)."""
    return json.dumps(doc).replace('"NUMBER:', "").replace('@"', "")


@pytest.mark.parametrize("value", list(HUGE.values()), ids=list(HUGE))
@pytest.mark.parametrize("reader", ["audit --search", "search-calibrate", "import chrome", "export-trace", "judge --checks"])
def test_a_number_past_a_floats_range_is_refused_as_it_is_read(tiny_model, tmp_path, reader, value, capsys):
    """Round three bounded the numbers each reader checks by name; a summary's `seconds` of 10**309 still reached
    math.isfinite (OverflowError). load_json now refuses it for every reader, packed or not."""
    number = value if isinstance(value, int) else f"NUMBER:{value}@"
    docs = {"audit --search": search_summary(default_us=number), "search-calibrate": search_summary(best_us=number),
            "import chrome": {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": number}]},
            "export-trace": trace_doc() | {"token_wall_us": [number] * 6}, "judge --checks": {"token_floor_us": number}}
    path = tmp_path / "in.json"
    path.write_bytes(gzip.compress(dumped(docs[reader]).encode()) if reader == "import chrome" else
                     dumped(docs[reader]).encode())
    (tmp_path / "t.json").write_text(json.dumps(trace_doc()))
    t, out = str(tmp_path / "t.json"), str(tmp_path / "out")
    argv = {"audit --search": ["audit", tiny_model, "--trace", t, "--target", "h200", "--no-hash-check",
                               "--search", str(path), "--out", out],
            "search-calibrate": ["search-calibrate", "--summary", str(path), "--ledger", str(tmp_path / "L"),
                                 "--target", "h200"],
            "import chrome": ["import", "chrome", str(path), "--tokens", "1", "--out", out],
            "export-trace": ["export-trace", str(path), "--chrome", out],
            "judge --checks": ["judge", "--baseline", t, "--candidate", t, "--checks", str(path)]}[reader]
    said_once(capsys, 2, main(argv), "past a float's range")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "t.json"]


@FEW
@given(st.one_of(st.integers(-(10 ** 400), 10 ** 400), st.floats(allow_nan=False, allow_infinity=False),
                 st.from_regex(r"-?[1-9][0-9]{0,400}(\.[0-9]{1,20})?[eE][+-]?[0-9]{1,4}", fullmatch=True)))
def test_load_json_gives_a_finite_float_sized_number_or_one_line(tmp_path_factory, number):
    path = tmp_path_factory.mktemp("n") / "n.json"
    path.write_text(f'{{"x": [{number}]}}')
    try:
        got = load_json(path, "numbers")["x"][0]
    except BadInput as e:
        assert "past a float's range" in str(e) and "\n" not in str(e)
        assert not math.isfinite(float(str(number))) if not isinstance(number, int) else abs(number) > 1e308
        return
    assert math.isfinite(float(got))          # no OverflowError, no inf
    assert got == (number if isinstance(number, int) else float(str(number)))   # and read exactly as written


def test_a_search_summarys_names_are_a_list(tmp_path, capsys):
    from boltbeam.report.audit import load_funnel
    for bad in (5, "k", [1]):
        (tmp_path / "s.json").write_text(json.dumps(search_summary() | {"search_space_incomplete": bad}))
        with pytest.raises(BadInput, match="search_space_incomplete must be a list of kernel names"):
            load_funnel(str(tmp_path / "s.json"))


# --- a refusal is one line, whatever it quotes ------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["inspect", "/no/such\nfile.gguf"],
    ["judge", "--baseline", "/no/such\rtrace.json", "--candidate", "/x"],
    ["profile", "M", "--device", "CPU", "--split-attention", "4\n:kernel", "--out", "D/t.json"],
    ["profile", "M", "--device", "CPU", "--fusion", "norm\u2028gated", "--out", "D/t.json"],
    ["tune", "M", "--device", "CPU", "--target", "h200", "--families", "layout\nfusion", "--out", "D"],
    ["bound", "M", "--target", "h200", "extra\nargument"],
], ids=["path", "path-cr", "split", "fusion", "families", "argparse"])
def test_a_refusal_quoting_a_line_break_is_still_one_line(tiny_model, tmp_path, argv, capsys):
    argv = [tiny_model if a == "M" else a.replace("D", str(tmp_path / "D")) if a.startswith("D") else a for a in argv]
    err = said_once(capsys, 2, main(argv))
    assert err.splitlines() == [err.rstrip("\n")]
    assert not (tmp_path / "D").exists()


@FEW
@given(st.text())
def test_one_line_leaves_no_line_break_and_hides_no_text(text):
    shown = one_line(text)
    assert len(shown.splitlines()) <= 1
    assert all(c in shown for c in text if c.isprintable())
    if len(text.splitlines()) <= 1 and text.isprintable():
        assert shown == text            # text with nothing to escape is left as it is


# --- generate's prompt, checked before tinygrad's tokenizer is built -------------------------------

@pytest.mark.parametrize("prompt, says", [
    ("caf\udce9", "is not UTF-8 text (at character 3)"),       # argv's undecodable byte, as Python hands it on
    ("a" * 257, "a run of 257 characters of one kind"),
    ("so " + "!" * 300, "a run of 300 characters of one kind from character 3"),
    (" " * 1000 + "x", "a run of 1,000 characters"),
    ("word " * 6000, "30,000 bytes are more than 4,096 positions hold (tokens of at most 7 bytes)"),
], ids=["not-utf8", "letters", "punctuation", "spaces", "too-long"])
def test_a_prompt_the_tokenizer_cannot_take_in_bounded_time_is_refused_first(tiny_model, prompt, says, capsys,
                                                                             monkeypatch):
    """tinygrad.llm's tokenizer merges a word in time quadratic in its length (16,000 letters: a minute), and a
    lone surrogate is a UnicodeEncodeError deep inside it: both refused before it is built. (The tiny model's
    tokens are at most 7 bytes long: 30,000 bytes cannot fit its 4,096 positions.)"""
    from boltbeam.route import use
    monkeypatch.setattr(use, "tokenizer_of", lambda kv: pytest.fail("the tokenizer was built"))
    said_once(capsys, 2, main(["generate", tiny_model, "--prompt", prompt, "--max-tokens", "1"]), says)


@pytest.mark.parametrize("prompt", ["\x00\x1b[31m red\r\n", "a" * 256 + " " + "é" * 256, "日本語 " * 100])
def test_a_prompt_within_bounds_reaches_the_tokenizer(tiny_model, prompt, capsys, monkeypatch):
    from boltbeam.route import use
    seen = []

    def stop(kv):
        seen.append(kv)
        raise BadInput("stopped at the tokenizer")
    monkeypatch.setattr(use, "tokenizer_of", stop)
    monkeypatch.setattr("boltbeam.measure.tinygrad_run.open_device", lambda device: None)
    monkeypatch.setenv("DEV", "CPU")          # (generate sets it; the test leaves the process as it found it)
    said_once(capsys, 2, main(["generate", tiny_model, "--prompt", prompt, "--max-tokens", "1"]), "stopped")
    assert len(seen) == 1


@pytest.mark.parametrize("tokens, types", [(["a", "\u4e00"], [1, 1]), (["a", "b", "c"], [1]), (["a", 7], [1, 1])],
                         ids=["a-piece-no-byte-spells", "fewer-types", "a-number"])
def test_a_vocabulary_tinygrads_tokenizer_cannot_read_is_one_line(tokens, types):
    """A GGUF file that says gpt2 but holds no byte-level vocabulary was a KeyError inside tinygrad.llm's
    tokenizer, in generate and in use.load."""
    from boltbeam.route import use
    with pytest.raises(BadInput, match="not byte-level BPE"):
        use.tokenizer_of({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
                          "tokenizer.ggml.token_type": types})
