"""The ledger: an append-only, hash-chained record of verdicts, so nobody pays twice for a refuted idea.

One SQLite file in WAL mode. The database itself refuses UPDATE and DELETE (triggers) and any
insert that is not the next link of the chain. Every entry stores
sha256(canonical JSON of its fields, the previous entry's hash included), so `verify` finds an edit
made behind the tool's back (triggers dropped) and names the first bad entry. An append is one
`BEGIN IMMEDIATE` transaction: reading the previous hash and inserting the new entry are atomic,
however many processes append at once, and a writer killed mid-append loses only the uncommitted one.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from boltbeam.errors import BadInput
from boltbeam.files import sha256_file
from boltbeam.judge.scope import ScopeKey
from boltbeam.judge.verdicts import NEEDS_REOPEN, VERDICTS
from boltbeam.ledger import reopen

DEFAULT_PATH = Path(".boltbeam") / "ledger.sqlite"
APPLICATION_ID = 0x426F4C42    # "BoLB" in the SQLite header: marks the file as a BoltBeam ledger
SCHEMA_VERSION = 1
GENESIS = "0" * 64             # the "previous hash" of entry #1
BUSY_TIMEOUT_S = 60.0          # how long an append waits for another writer's transaction
# Scope keys that name an idea (rather than the circumstances it was judged in); should_skip
# matches other candidates' entries on these when the asking context names a setting.
IDEA_KEYS = (ScopeKey.SETTING, ScopeKey.KERNEL_KIND, ScopeKey.TARGET, ScopeKey.FORMAT)

_SCHEMA = (
    """CREATE TABLE entries (
        id        INTEGER PRIMARY KEY,
        candidate TEXT NOT NULL,
        verdict   TEXT NOT NULL,
        reasons   TEXT NOT NULL,   -- JSON list of sentences
        scope     TEXT NOT NULL,   -- JSON object
        evidence  TEXT NOT NULL,   -- JSON list of {path, sha256}
        reopen    TEXT,
        time      TEXT NOT NULL,   -- UTC, ISO 8601
        actor     TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash      TEXT NOT NULL UNIQUE)""",
    "CREATE INDEX entries_by_candidate ON entries (candidate, id)",
    """CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
       BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: entries cannot be changed'); END""",
    """CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
       BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: entries cannot be deleted'); END""",
    # INSERT OR REPLACE deletes without firing delete triggers, so inserts are guarded too:
    # only the next id, linked to the current last hash, may go in.
    f"""CREATE TRIGGER entries_append_only BEFORE INSERT ON entries
       WHEN NEW.id IS NOT (SELECT COALESCE(MAX(id), 0) + 1 FROM entries)
         OR NEW.prev_hash IS NOT COALESCE((SELECT hash FROM entries ORDER BY id DESC LIMIT 1), '{GENESIS}')
       BEGIN SELECT RAISE(ABORT, 'the ledger is append-only: an entry must extend the chain'); END""",
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_GUARDS = ("entries_no_update", "entries_no_delete", "entries_append_only")
_COLUMNS = ("id", "candidate", "verdict", "reasons", "scope", "evidence", "reopen", "time", "actor",
            "prev_hash", "hash")
_JSON_COLUMNS = ("reasons", "scope", "evidence")


def canonical(obj: Any) -> str:
    """The one JSON spelling of a value: sorted keys, no spaces. Hashes and exports use it."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def scope_matches(scope: dict[str, Any], key: dict[str, Any]) -> bool:
    """Whether a stored scope holds each of `key`'s values, compared in their canonical spelling (a key the
    scope lacks holds null). How the search finds what it timed or judged before in the same scope."""
    return all(canonical(scope.get(k)) == canonical(v) for k, v in key.items())


def chain_hash(fields: dict[str, Any]) -> str:
    """sha256 over an entry's fields (everything but `hash`, `prev_hash` included)."""
    return hashlib.sha256(canonical({k: fields[k] for k in _COLUMNS if k != "hash"}).encode()).hexdigest()


@dataclass(frozen=True)
class Draft:
    """An entry checked and its evidence hashed, before it has a place in the chain."""
    candidate: str
    verdict: str
    reasons: list[str]
    scope: dict[str, Any]
    evidence: list[dict[str, str]]   # {path, sha256}
    reopen: str | None
    actor: str


@dataclass(frozen=True)
class Entry(Draft):
    id: int
    time: str
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _COLUMNS}

    @property
    def blocks(self) -> bool:
        """A verdict that takes the idea out of the search until its reopen condition is met."""
        return self.verdict in NEEDS_REOPEN


@dataclass(frozen=True)
class Verification:
    entries: int
    head: str                  # hash of the last entry (GENESIS when empty); pin it to detect truncation
    bad_entry: int | None      # the first entry that fails, or None
    problem: str | None        # what is wrong, or None when the ledger is intact

    @property
    def ok(self) -> bool:
        return self.problem is None


def _utf8(text: Any, what: str) -> Any:
    """Text that UTF-8 can store; the shell hands undecodable bytes in as lone surrogates."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(f"ledger entry: the {what} is not valid UTF-8 text") from None
    return text


def draft(*, candidate: str, verdict: str, reasons: list[str], scope: dict[str, Any],
          evidence: list[str], reopen: str | None, actor: str) -> Draft:
    """Check an entry and hash its evidence files; any problem is one BadInput line."""
    for what, text in (("candidate", candidate), ("reopen condition", reopen), ("actor", actor),
                       *(("reason", r) for r in (reasons if isinstance(reasons, list) else []))):
        _utf8(text, what)
    if not isinstance(candidate, str) or not candidate.strip():
        raise BadInput("ledger entry: candidate id is empty")
    if verdict not in VERDICTS:
        raise BadInput(f"ledger entry: unknown verdict {verdict!r} (one of: {', '.join(VERDICTS)})")
    if isinstance(reasons, str) or not reasons or not all(isinstance(r, str) and r.strip() for r in reasons):
        raise BadInput("ledger entry: reasons must be a non-empty list of sentences")
    if not isinstance(scope, dict):
        raise BadInput(f"ledger entry: scope must be a JSON object, not {type(scope).__name__}")
    try:
        scope = json.loads(_utf8(canonical(scope), "scope"))   # what is stored is what is hashed, keys as text
    except (TypeError, ValueError) as e:
        raise BadInput(f"ledger entry: scope is not plain JSON ({e})") from None
    reopen = reopen.strip() if isinstance(reopen, str) and reopen.strip() else None
    if verdict in NEEDS_REOPEN and reopen is None:
        raise BadInput(f"ledger entry: a {verdict} verdict needs a reopen condition "
                       "(when may it be tried again?)")
    if not isinstance(actor, str) or not actor.strip():
        raise BadInput("ledger entry: actor is empty (who or what ran it?)")
    if isinstance(evidence, (str, bytes)):
        raise BadInput("ledger entry: evidence must be a list of file paths")
    files = []
    for path in evidence:
        if not os.path.isfile(path):
            raise BadInput(f"evidence {path}: no such file")
        files.append({"path": os.fspath(path), "sha256": sha256_file(path)})
    return Draft(candidate=candidate.strip(), verdict=verdict, reasons=[r.strip() for r in reasons],
                 scope=scope, evidence=files, reopen=reopen, actor=actor.strip())


class Ledger:
    """One ledger file. `Ledger(path)` creates the file, its folder and the schema if missing;
    with create=False it is opened read-only (so a ledger on read-only media can be listed and
    verified) and a missing file is BadInput. A file that is not a ledger is always BadInput."""

    def __init__(self, path: str | os.PathLike = DEFAULT_PATH, *, create: bool = True):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise BadInput(f"ledger {self.path}: not a file")
        if not self.path.exists():
            if not create:
                raise BadInput(f"ledger {self.path}: no such file")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = (sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None) if create
                        else _read_only(self.path))
        except sqlite3.OperationalError as e:
            raise BadInput(f"ledger {self.path}: cannot open ({e})") from None
        except sqlite3.DatabaseError as e:
            raise BadInput(f"ledger {self.path}: not a BoltBeam ledger ({e})") from None
        # Setting up takes locks SQLite may refuse at once rather than wait for (switching to WAL while
        # another process creates the file): such a refusal is retried until the busy timeout.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._open(create)
                return
            except sqlite3.OperationalError as e:
                if "locked" in str(e) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                self._db.close()
                raise BadInput(f"ledger {self.path}: cannot open ({e})") from None
            except sqlite3.DatabaseError as e:
                self._db.close()
                raise BadInput(f"ledger {self.path}: not a BoltBeam ledger ({e})") from None
            except BaseException:
                self._db.close()
                raise

    def _state(self) -> str:
        """What the file is: "ledger", or "empty" (new); anything else is BadInput. Reads only, in one
        statement, so a ledger another process is creating is seen before or after, never half-made."""
        app_id, version, objects = self._db.execute(
            "SELECT application_id, user_version, (SELECT COUNT(*) FROM sqlite_master) "
            "FROM pragma_application_id, pragma_user_version").fetchone()
        if app_id == APPLICATION_ID:
            if version > SCHEMA_VERSION:
                raise BadInput(f"ledger {self.path}: schema version {version} is newer than "
                               f"this boltbeam's ({SCHEMA_VERSION})")
            return "ledger"
        if app_id == 0 and objects == 0:
            return "empty"
        raise BadInput(f"ledger {self.path}: an SQLite database, but not a BoltBeam ledger")

    def _open(self, create: bool) -> None:
        state = self._state()   # before anything is written: a stranger's file stays untouched
        if state == "empty" and not create:
            raise BadInput(f"ledger {self.path}: empty file, not a BoltBeam ledger")
        if not create:
            return   # read-only: nothing to set up
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")   # a committed verdict survives power loss too
        if state == "empty":
            with _immediate(self._db):
                if self._state() == "empty":   # another process may have created it meanwhile
                    for statement in _SCHEMA:
                        self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing -------------------------------------------------------------------------

    def append(self, *, candidate: str, verdict: str, reasons: list[str], scope: dict[str, Any],
               evidence: list[str], reopen: str | None, actor: str) -> int:
        """Record one verdict; returns the new entry's id. Evidence files are hashed here."""
        return self.record(draft(candidate=candidate, verdict=verdict, reasons=reasons, scope=scope,
                                 evidence=evidence, reopen=reopen, actor=actor))

    def record(self, d: Draft) -> int:
        """Append a checked draft as the next link of the chain; returns its id. A disk that is full or
        read-only is one BadInput line; the transaction rolls back and the chain stays as it was."""
        try:
            return self._record(d)
        except sqlite3.OperationalError as e:
            raise BadInput(f"ledger {self.path}: cannot write ({e})") from None

    def _record(self, d: Draft) -> int:
        with _immediate(self._db):
            last = self._db.execute("SELECT id, hash FROM entries ORDER BY id DESC LIMIT 1").fetchone()
            last_id, prev_hash = last if last else (0, GENESIS)
            fields = asdict(d) | {"id": last_id + 1, "prev_hash": prev_hash,
                                  "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
            fields["hash"] = chain_hash(fields)
            row = [canonical(fields[k]) if k in _JSON_COLUMNS else fields[k] for k in _COLUMNS]
            self._db.execute(f"INSERT INTO entries ({', '.join(_COLUMNS)}) "
                             f"VALUES ({', '.join('?' * len(_COLUMNS))})", row)
        return fields["id"]

    # --- reading -------------------------------------------------------------------------

    def _select(self, where: str = "", params: tuple = ()) -> list[Entry]:
        rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM entries {where} ORDER BY id", params)
        return [_entry(row) for row in rows]

    def entries(self, *, candidate: str | None = None, verdict: str | None = None) -> list[Entry]:
        """Every entry, oldest first, optionally only one candidate's and/or one verdict's."""
        clauses = [(f"{col} = ?", val) for col, val in (("candidate", candidate), ("verdict", verdict))
                   if val is not None]
        where = "WHERE " + " AND ".join(c for c, _ in clauses) if clauses else ""
        return self._select(where, tuple(v for _, v in clauses))

    def entry(self, entry_id: int) -> Entry:
        found = self._select("WHERE id = ?", (entry_id,))
        if not found:
            raise BadInput(f"ledger {self.path}: no entry #{entry_id}")
        return found[0]

    def blocking(self, candidate: str | None = None, **scope: Any) -> list[Entry]:
        """The blocking entries (refute, search-space-incomplete), oldest first, that are still each
        candidate's latest word (a later entry for the same candidate supersedes) and are about this
        candidate, or whose scope holds every given key with the given value. With neither: all."""
        latest = self._select(
            f"AS e WHERE verdict IN ({', '.join('?' * len(NEEDS_REOPEN))}) "
            "AND id = (SELECT MAX(id) FROM entries WHERE candidate = e.candidate)", NEEDS_REOPEN)

        def matches(e: Entry) -> bool:
            if candidate is None and not scope:
                return True
            return e.candidate == candidate or (bool(scope) and all(
                k in e.scope and reopen.as_text(e.scope[k]) == reopen.as_text(v) for k, v in scope.items()))
        return [e for e in latest if matches(e)]

    def should_skip(self, candidate: str, context: dict[str, Any]) -> tuple[bool, str]:
        """Must the search skip this candidate in this context? (skip, one sentence why).
        Blocking entries count when they are about the candidate, or (when the context names a
        setting) record the same setting, kernel kind, target and format as far as the context names
        them. The candidate is skipped unless every such entry's reopen condition is met."""
        keys = {k: context[k] for k in IDEA_KEYS if k in context} if ScopeKey.SETTING in context else {}
        found = self.blocking(candidate, **keys)
        for e in reversed(found):   # the newest unmet one speaks
            met, why_not = reopen.check(e.reopen or "", context)
            if not met:
                about = "" if e.candidate == candidate else f" (same {', '.join(keys)})"
                return True, (f"skip {candidate}: ledger entry #{e.id} ({e.time[:10]}) recorded {e.verdict} "
                              f"for {e.candidate}{about}: {' '.join(e.reasons)} Reopens when {e.reopen} "
                              f"(not met: {why_not}).")
        if found:
            ids = ", ".join(f"#{e.id}" for e in found)
            return False, f"{candidate} is reopened: the reopen condition of every blocking entry holds ({ids})."
        return False, f"{candidate}: no blocking entry in the ledger."

    # --- checking ------------------------------------------------------------------------

    def verify(self) -> Verification:
        """Walk the chain from the first entry; name the first entry that does not hold."""
        count, prev_id, prev_hash = 0, 0, GENESIS
        try:
            for row in self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM entries ORDER BY id"):
                fields = dict(zip(_COLUMNS, row))
                problem = _broken_link(fields, prev_id, prev_hash)
                if problem:
                    return Verification(count, prev_hash, fields["id"], f"entry #{fields['id']} {problem}")
                count, prev_id, prev_hash = count + 1, fields["id"], fields["hash"]
            present = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        except sqlite3.DatabaseError as e:
            return Verification(count, prev_hash, prev_id + 1, f"the file is damaged after entry #{prev_id} ({e})")
        missing = [g for g in _GUARDS if g not in present]
        if missing:
            return Verification(count, prev_hash, None,
                                f"the append-only triggers are gone ({', '.join(missing)}): the file was altered")
        return Verification(count, prev_hash, None, None)


def _read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write: reading a ledger never changes it, and works on read-only media."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): takes the write lock up front, so a read
    of the last hash and the insert after it cannot interleave with another writer's."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _broken_link(fields: dict[str, Any], prev_id: int, prev_hash: str) -> str | None:
    """What is wrong with one stored row given the entry before it, or None."""
    if fields["id"] != prev_id + 1:
        return f"follows entry #{prev_id}: entries are missing"
    if fields["prev_hash"] != prev_hash:
        return f"does not link to entry #{prev_id} (its previous-hash differs): an entry was changed or removed"
    try:
        parsed = fields | {k: json.loads(fields[k]) for k in _JSON_COLUMNS}
        recomputed = chain_hash(parsed)
    except (TypeError, ValueError):
        return "holds a field that is not valid JSON: it was edited"
    if recomputed != fields["hash"]:
        return "does not match its hash: it was edited after it was written"
    return None


def _entry(row: tuple) -> Entry:
    fields = dict(zip(_COLUMNS, row))
    return Entry(**{k: json.loads(v) if k in _JSON_COLUMNS else v for k, v in fields.items()})


def to_jsonl(entries: list[Entry]) -> str:
    """JSON Lines, one canonical entry a line: stable text for review in a pull request."""
    return "".join(canonical(e.to_dict()) + "\n" for e in entries)
