"""The ledger: append-only in the database itself, hash-chained, crash- and concurrency-safe, and
the query the search uses to skip refuted ideas."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.files import sha256_file
from boltbeam.ledger import reopen
from boltbeam.ledger.store import GENESIS, Ledger, chain_hash

REPO = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).resolve().parent / "ledger_writer.py"


def cli(*args: str) -> int:
    """Run `boltbeam ARGS` in-process; argparse's own errors exit via SystemExit."""
    try:
        return main(list(args))
    except SystemExit as e:
        return e.code


def writer(path: Path, count: int, actor: str) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, str(WRITER), str(path), str(count), actor],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def add(ledger: Ledger, candidate: str, verdict: str = "diagnostic", reasons: list[str] | None = None,
        scope: dict | None = None, evidence: list[str] | None = None, reopen: str | None = None) -> int:
    return ledger.append(candidate=candidate, verdict=verdict, reasons=reasons or [f"{candidate} {verdict}."],
                         scope=scope or {}, evidence=evidence or [], reopen=reopen, actor="test")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def five(path: Path) -> Path:
    """A ledger of five entries."""
    with Ledger(path) as ledger:
        for i in range(1, 6):
            add(ledger, f"c{i}")
    return path


def raw(path: Path) -> sqlite3.Connection:
    """A connection behind the tool's back."""
    return sqlite3.connect(path, isolation_level=None)


def drop_triggers(db: sqlite3.Connection) -> None:
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f"DROP TRIGGER {name}")


# --- writing and reading back --------------------------------------------------------------

def test_append_records_every_field_and_chains_entries(tmp_path: Path):
    trace = tmp_path / "trace.json"
    trace.write_text('{"token_wall_us": [1]}')
    with Ledger(tmp_path / "deep" / "folder" / "ledger.sqlite") as ledger:
        first = add(ledger, "upcast4", "candidate", scope={"target": "h200", "upcast": 4})
        second = add(ledger, "upcast4", "refute", reasons=["Output differs.", "Slower."], evidence=[str(trace)],
                     scope={"target": "h200"}, reopen="compiler_version!=0.13.0")
        a, b = ledger.entry(first), ledger.entry(second)
    assert (first, second) == (1, 2)
    assert (b.candidate, b.verdict, b.reasons, b.reopen, b.actor) == (
        "upcast4", "refute", ["Output differs.", "Slower."], "compiler_version!=0.13.0", "test")
    assert a.scope == {"target": "h200", "upcast": 4}
    assert b.evidence == [{"path": str(trace), "sha256": sha256_file(trace)}]
    assert b.time.endswith("Z") and b.time[:4].isdigit()
    assert a.prev_hash == GENESIS and b.prev_hash == a.hash
    assert b.hash == chain_hash(b.to_dict())


def test_ledger_file_is_sqlite_in_wal_mode(path: Path):
    Ledger(path).close()
    assert raw(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_entries_filter_by_candidate_and_verdict(five: Path):
    with Ledger(five) as ledger:
        add(ledger, "c2", "promote")
        assert [e.id for e in ledger.entries(candidate="c2")] == [2, 6]
        assert [e.id for e in ledger.entries(verdict="promote")] == [6]
        assert [e.id for e in ledger.entries(candidate="c2", verdict="diagnostic")] == [2]


# --- append-only and tamper evidence -------------------------------------------------------

@pytest.mark.parametrize("sql", [
    "UPDATE entries SET verdict = 'promote' WHERE id = 3",
    "DELETE FROM entries WHERE id = 3",
    "INSERT OR REPLACE INTO entries SELECT * FROM entries WHERE id = 3",   # a delete that skips delete triggers
])
def test_database_itself_refuses_changes(five: Path, sql: str):
    with Ledger(five) as ledger:
        before = ledger.entries()
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw(five).execute(sql)
    with Ledger(five) as ledger:
        assert ledger.entries() == before
        assert ledger.verify().ok


def test_verify_names_the_first_entry_edited_behind_its_back(five: Path, capsys):
    db = raw(five)
    drop_triggers(db)
    db.execute("""UPDATE entries SET reasons = '["it was fine."]' WHERE id = 3""")
    db.execute("""UPDATE entries SET verdict = 'promote' WHERE id = 4""")
    with Ledger(five) as ledger:
        result = ledger.verify()
    assert not result.ok and result.bad_entry == 3 and result.entries == 2
    assert cli("ledger", "verify", "--ledger", str(five)) == 3
    err = capsys.readouterr().err
    assert "entry #3" in err and len(err.strip().splitlines()) == 1


def test_verify_catches_an_edit_whose_hash_was_recomputed(five: Path):
    db = raw(five)
    drop_triggers(db)
    row = db.execute("SELECT * FROM entries WHERE id = 3").fetchone()
    columns = [d[0] for d in db.execute("SELECT * FROM entries LIMIT 0").description]
    forged = dict(zip(columns, row)) | {"verdict": "refute"}
    forged = {k: json.loads(v) if k in ("reasons", "scope", "evidence") else v for k, v in forged.items()}
    db.execute("UPDATE entries SET verdict = 'refute', hash = ? WHERE id = 3", (chain_hash(forged),))
    with Ledger(five) as ledger:
        result = ledger.verify()
    assert result.bad_entry == 4    # #3 now hashes right, but #4 still points at the old #3


def test_verify_catches_a_removed_entry(five: Path):
    db = raw(five)
    drop_triggers(db)
    db.execute("DELETE FROM entries WHERE id = 2")
    with Ledger(five) as ledger:
        assert ledger.verify().bad_entry == 3


def test_verify_reports_dropped_triggers(five: Path, capsys):
    drop_triggers(raw(five))
    with Ledger(five) as ledger:
        result = ledger.verify()
    assert not result.ok and result.bad_entry is None and "triggers" in result.problem
    assert cli("ledger", "verify", "--ledger", str(five)) == 3


def test_verify_passes_and_reports_the_head(five: Path, capsys):
    with Ledger(five) as ledger:
        head = ledger.entry(5).hash
    assert cli("ledger", "verify", "--ledger", str(five), "--json") == 0
    assert json.loads(capsys.readouterr().out) == {
        "entries": 5, "head": head, "bad_entry": None, "problem": None, "ok": True}


# --- crashes and concurrent writers --------------------------------------------------------

def test_writer_killed_mid_run_loses_no_committed_entry(path: Path):
    proc = writer(path, 1000, "w")
    committed = []
    while len(committed) < 100:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        committed.append(int(line))
    os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
    committed += [int(line) for line in out.split()]
    assert proc.returncode == -signal.SIGKILL and len(committed) < 1000   # it really died mid-run
    with Ledger(path) as ledger:
        stored = {e.id: e.candidate for e in ledger.entries()}
        assert all(stored.get(i) == f"w-{i - 1}" for i in committed)
        assert ledger.verify().ok
        assert add(ledger, "after-crash") == len(stored) + 1   # and the ledger still takes appends
        assert ledger.verify().ok


def test_four_writers_at_once_lose_nothing_and_keep_the_chain(path: Path):
    procs = {actor: writer(path, 500, actor) for actor in "abcd"}   # they also race to create the file
    printed = {}
    for actor, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        printed[actor] = [int(line) for line in out.split()]
    assert sorted(i for ids in printed.values() for i in ids) == list(range(1, 2001))
    with Ledger(path) as ledger:
        entries = ledger.entries()
        assert ledger.verify().ok
    assert len(entries) == 2000
    for actor, ids in printed.items():   # each writer's entries are its own, in its order
        assert [entries[i - 1].candidate for i in ids] == [f"{actor}-{n}" for n in range(500)]


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("extra, expected", [
    (["--verdict", "promote", "--evidence", "MISSING"], "no such file"),
    (["--verdict", "refuted"], "invalid choice"),
    (["--verdict", "refute"], "needs a reopen condition"),
    (["--verdict", "search-space-incomplete", "--reopen", "  "], "needs a reopen condition"),
    (["--verdict", "promote", "--scope", "no-equals-sign"], "KEY=VALUE"),
])
def test_cli_bad_entry_is_one_line_exit_2_and_writes_nothing(five: Path, tmp_path: Path, capsys, extra, expected):
    extra = [str(tmp_path / "missing.json") if a == "MISSING" else a for a in extra]
    code = cli("ledger", "add", "--ledger", str(five), "--candidate", "c9", "--reason", "Because.", *extra)
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with Ledger(five) as ledger:
        assert len(ledger.entries()) == 5


def test_cli_bad_entry_does_not_create_a_ledger(tmp_path: Path, capsys):
    target = tmp_path / "new" / "ledger.sqlite"
    code = cli("ledger", "add", "--ledger", str(target), "--candidate", "c", "--verdict", "refute", "--reason", "No.")
    assert code == 2 and not target.parent.exists()


def make_foreign_sqlite(p: Path) -> None:
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE notes (text TEXT)")
    db.commit()
    db.close()


@pytest.mark.parametrize("make, expected", [
    (lambda p: p.write_text("just some text, not a database\n" * 10), "not a BoltBeam ledger"),
    (make_foreign_sqlite, "not a BoltBeam ledger"),
])
@pytest.mark.parametrize("command", [
    ["add", "--candidate", "c", "--verdict", "promote", "--reason", "Yes."], ["list"], ["verify"], ["export"],
])
def test_cli_file_that_is_not_a_ledger_is_one_line_exit_2_untouched(tmp_path: Path, capsys, make, expected, command):
    p = tmp_path / "other.db"
    make(p)
    before = p.read_bytes()
    code = cli("ledger", command[0], "--ledger", str(p), *command[1:])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert p.read_bytes() == before
    assert sorted(tmp_path.iterdir()) == [p]   # no -wal or -shm beside it either


def test_cli_reading_a_missing_ledger_is_exit_2_and_creates_nothing(tmp_path: Path, capsys):
    target = tmp_path / "nope.sqlite"
    assert cli("ledger", "list", "--ledger", str(target)) == 2
    assert "no such file" in capsys.readouterr().err and not target.exists()


@pytest.mark.parametrize("change, expected", [
    ({"verdict": "refuted"}, "unknown verdict"),
    ({"verdict": "refute", "reopen": None}, "needs a reopen condition"),
    ({"evidence": ["/no/such/trace.json"]}, "no such file"),
    ({"reasons": []}, "reasons"),
    ({"reasons": "a string, not a list"}, "reasons"),
    ({"candidate": " "}, "candidate"),
    ({"actor": ""}, "actor"),
    ({"scope": {"x": float("nan")}}, "scope"),
])
def test_append_bad_input_is_bad_input_and_writes_nothing(path: Path, change: dict, expected: str):
    fields = dict(candidate="c", verdict="promote", reasons=["Faster."], scope={}, evidence=[], reopen=None,
                  actor="test") | change
    with Ledger(path) as ledger:
        with pytest.raises(BadInput, match=expected) as caught:
            ledger.append(**fields)
        assert ledger.entries() == []
    assert "\n" not in str(caught.value)


# --- refuted ideas leave the search --------------------------------------------------------

def test_reopen_condition_parsing():
    assert reopen.parse("compiler_version!=0.13.0") == [("compiler_version", "!=", "0.13.0")]
    assert reopen.parse(" compiler = tinygrad ; target=h200; ") == [("compiler", "=", "tinygrad"), ("target", "=", "h200")]
    assert reopen.parse("when tinygrad can fuse dequant into the matvec") is None
    assert reopen.parse("a=") is None and reopen.parse("a=b=c") is None


def test_refuted_candidate_is_skipped_with_its_reason(path: Path):
    with Ledger(path) as ledger:
        add(ledger, "upcast4", "refute", reasons=["Output tokens differ."], reopen="compiler_version!=0.13.0")
        skip, why = ledger.should_skip("upcast4", {"compiler_version": "0.13.0"})
        assert skip and "Output tokens differ." in why and "#1" in why and "compiler_version" in why
        assert ledger.should_skip("other", {"compiler_version": "0.13.0"})[0] is False


def test_met_reopen_condition_lifts_the_skip(path: Path):
    with Ledger(path) as ledger:
        add(ledger, "upcast4", "refute", reopen="compiler=tinygrad; compiler_version!=0.13.0")
        assert ledger.should_skip("upcast4", {"compiler": "tinygrad", "compiler_version": "0.14.0"})[0] is False
        assert ledger.should_skip("upcast4", {"compiler": "tinygrad", "compiler_version": "0.13.0"})[0] is True
        assert ledger.should_skip("upcast4", {"compiler": "other", "compiler_version": "0.14.0"})[0] is True
        assert ledger.should_skip("upcast4", {"compiler": "tinygrad"})[0] is True   # unknown is not met


def test_free_text_reopen_is_never_met(path: Path):
    with Ledger(path) as ledger:
        add(ledger, "wide-tiles", "search-space-incomplete", reopen="when the space can express 2D tiles")
        skip, why = ledger.should_skip("wide-tiles", {"compiler_version": "9.9"})
        assert skip and "a person must decide" in why


def test_later_entry_for_the_candidate_supersedes(path: Path):
    with Ledger(path) as ledger:
        add(ledger, "upcast4", "refute", reopen="compiler_version!=0.13.0")
        assert [e.id for e in ledger.blocking("upcast4")] == [1]
        add(ledger, "upcast4", "promote")
        assert ledger.blocking("upcast4") == []
        assert ledger.should_skip("upcast4", {"compiler_version": "0.13.0"})[0] is False
        add(ledger, "upcast4", "refute", reopen="target=h100")
        assert [e.id for e in ledger.blocking("upcast4")] == [3]


def test_only_refute_and_search_space_incomplete_block(path: Path):
    with Ledger(path) as ledger:
        for verdict in ("diagnostic", "candidate", "promote", "defer", "inconclusive", "adapter-incomplete"):
            add(ledger, verdict, verdict)
        add(ledger, "ssi", "search-space-incomplete", reopen="free text")
        assert [e.candidate for e in ledger.blocking()] == ["ssi"]


IDEA = {"setting": "UPCAST:4", "kernel_kind": "matvec", "target": "h200", "format": "q4_1"}


def test_a_setting_refuted_on_a_kernel_kind_target_and_format_blocks_other_candidates(path: Path):
    with Ledger(path) as ledger:
        add(ledger, "upcast4-blk3", "refute", reasons=["Spills registers."], scope=IDEA | {"model": "abc"},
            reopen="compiler_version!=0.13.0")
        add(ledger, "group8-blk3", "refute", scope=IDEA | {"setting": "GROUP:8"}, reopen="free text")
        assert [e.candidate for e in ledger.blocking(**IDEA)] == ["upcast4-blk3"]
        assert [e.candidate for e in ledger.blocking(setting="GROUP:8")] == ["group8-blk3"]
        assert ledger.blocking(setting="UPCAST:4", format="q8_0") == []
        skip, why = ledger.should_skip("upcast4-blk7", IDEA | {"compiler_version": "0.13.0"})
        assert skip and "upcast4-blk3" in why and "Spills registers." in why
        assert ledger.should_skip("upcast4-blk7", IDEA | {"format": "q8_0", "compiler_version": "0.13.0"})[0] is False
        assert ledger.should_skip("upcast4-blk7", IDEA | {"compiler_version": "0.14.0"})[0] is False


def test_scope_values_match_as_text(path: Path):
    with Ledger(path) as ledger:
        add(ledger, "u4", "refute", scope={"upcast": 4}, reopen="upcast!=4")
        assert [e.candidate for e in ledger.blocking(upcast="4")] == ["u4"]
        assert ledger.should_skip("u4", {"upcast": 4})[0] is True
        assert ledger.should_skip("u4", {"upcast": 8})[0] is False


# --- the CLI -------------------------------------------------------------------------------

def test_cli_add_list_show_why_export(tmp_path: Path, capsys):
    ledger = str(tmp_path / "l.sqlite")
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    assert cli("ledger", "add", "--ledger", ledger, "--candidate", "u4", "--verdict", "candidate",
               "--reason", "First [idea].", "--scope", "setting=UPCAST:4", "target=h200", "--actor", "alice") == 0
    assert cli("ledger", "add", "--ledger", ledger, "--candidate", "u4", "--verdict", "refute", "--json",
               "--reason", "Second one.", "--evidence", str(trace), "--reopen", "target=h100") == 0
    capsys.readouterr()

    assert cli("ledger", "list", "--ledger", ledger, "--verdict", "refute", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["id"], e["verdict"]) for e in listed] == [(2, "refute")]

    assert cli("ledger", "show", "2", "--ledger", ledger, "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["evidence"] == [{"path": str(trace), "sha256": sha256_file(trace)}] and shown["reopen"] == "target=h100"
    assert cli("ledger", "show", "1", "--ledger", ledger, "--json") == 0
    assert json.loads(capsys.readouterr().out)["scope"] == {"setting": "UPCAST:4", "target": "h200"}

    assert cli("ledger", "list", "--ledger", ledger) == 0
    assert "First [idea]." in capsys.readouterr().out   # user text is not eaten as rich markup

    assert cli("ledger", "why", "u4", "--ledger", ledger) == 0
    story = capsys.readouterr().out
    assert story.index("First [idea].") < story.index("Second one.") < story.index("reopen when: target=h100")
    assert "skips it until" in story.splitlines()[0] and "alice" in story

    assert cli("ledger", "export", "--ledger", ledger) == 0
    exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["id"] for e in exported] == [1, 2] and exported[1] == shown
    out = tmp_path / "review" / "ledger.jsonl"
    assert cli("ledger", "export", "--ledger", ledger, "--out", str(out)) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == exported


def test_cli_show_missing_entry_is_exit_2(five: Path, capsys):
    assert cli("ledger", "show", "99", "--ledger", str(five)) == 2
    assert "no entry #99" in capsys.readouterr().err


def test_cli_why_unknown_candidate_says_never_judged(five: Path, capsys):
    assert cli("ledger", "why", "nobody", "--ledger", str(five)) == 0
    assert "never judged" in capsys.readouterr().out


def test_cli_export_refuses_a_broken_chain(five: Path, tmp_path: Path, capsys):
    db = raw(five)
    drop_triggers(db)
    db.execute("UPDATE entries SET candidate = 'other' WHERE id = 2")
    out = tmp_path / "ledger.jsonl"
    assert cli("ledger", "export", "--ledger", str(five), "--out", str(out)) == 3
    assert "entry #2" in capsys.readouterr().err and not out.exists()


def test_cli_default_ledger_is_in_the_working_directory(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("ledger", "add", "--candidate", "c", "--verdict", "diagnostic", "--reason", "Measured.") == 0
    with Ledger(tmp_path / ".boltbeam" / "ledger.sqlite", create=False) as ledger:
        assert [e.candidate for e in ledger.entries()] == ["c"]


def test_text_that_is_not_utf8_is_one_line(tmp_path: Path, capsys):
    path = tmp_path / "l.db"
    bad = b"slow \xff".decode("utf-8", "surrogateescape")   # how the shell hands in undecodable bytes
    for flag in ("--reason", "--candidate"):
        args = {"--reason": "Fine.", "--candidate": "c"} | {flag: bad}
        code = main(["ledger", "add", "--ledger", str(path), "--verdict", "promote",
                     "--candidate", args["--candidate"], "--reason", args["--reason"]])
        err = capsys.readouterr().err
        assert code == 2 and "not valid UTF-8" in err and err.count("\n") == 1
    assert not path.exists()


def test_reading_a_ledger_leaves_it_unchanged_even_where_nothing_can_be_written(tmp_path: Path, capsys):
    """list, show, verify and export open the file read-only. Where SQLite cannot make its WAL index
    beside the file (as on read-only media; here a folder stands in its way) they still read it."""
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        ledger.append(candidate="c", verdict="promote", reasons=["Faster."], scope={}, evidence=[], reopen=None,
                      actor="t")
    before = sha256_file(path)
    (tmp_path / "l.db-shm").mkdir()
    for command in (["list", "--json"], ["show", "1", "--json"], ["verify", "--json"], ["export"]):
        assert main(["ledger", *command, "--ledger", str(path)]) == 0, command
        assert '"c"' in capsys.readouterr().out or command[0] == "verify"
    assert sha256_file(path) == before


def test_a_full_disk_is_one_line_and_the_chain_holds(tmp_path: Path, capsys, monkeypatch):
    path = tmp_path / "l.db"
    assert main(["ledger", "add", "--ledger", str(path), "--candidate", "c", "--verdict", "promote",
                 "--reason", "Faster."]) == 0

    def full(self, d):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(Ledger, "_record", full)
    assert main(["ledger", "add", "--ledger", str(path), "--candidate", "d", "--verdict", "promote",
                 "--reason", "Faster."]) == 2
    assert "cannot write (database or disk is full)" in capsys.readouterr().err
    monkeypatch.undo()
    with Ledger(path, create=False) as ledger:
        assert ledger.verify().ok and [e.candidate for e in ledger.entries()] == ["c"]


def test_a_lock_refused_while_setting_up_is_waited_out(path: Path, monkeypatch):
    """SQLite may refuse a set-up lock at once instead of waiting (switching to WAL while another
    process creates the file): the ledger tries again until its busy timeout; any other failure to open
    is one line, and the file is not called a stranger's."""
    from boltbeam.ledger import store
    real, refusals = store.Ledger._open, []

    def refused_twice(self, create):
        if len(refusals) < 2:
            refusals.append(1)
            raise sqlite3.OperationalError("database is locked")
        return real(self, create)
    monkeypatch.setattr(store.Ledger, "_open", refused_twice)
    with Ledger(path) as ledger:
        assert ledger.entries() == [] and len(refusals) == 2

    def broken(self, create):
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(store.Ledger, "_open", broken)
    with pytest.raises(BadInput, match="cannot open .disk I/O error"):
        Ledger(path)
