"""The README's claims, checked where they can be without running a model: its links and the docs' resolve,
the commands it shows parse with the real parser, it stays short with tables a renderer keeps whole, and
its first two commands are the ones the newcomer and CI run. Markdown is read with markdown-it (rich's own
parser), so a table or a link is what a renderer sees."""
import argparse
import contextlib
import io
import os
import pathlib
import re
import shlex

import pytest
from markdown_it import MarkdownIt

from boltbeam.cli import build_parser

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "docs" / "cli.md", ROOT / "docs" / "design.md"]
FIRST = ("bash scripts/setup.sh && .venv/bin/boltbeam audit --device CPU --target host --context 16 --tokens 5 "
         "--out audit")
MAX_LINES, MAX_CELL = 220, 300
SHELL_OPERATOR = re.compile(r"[;&|<>()]+")     # what shlex's punctuation_chars splits out: ends a command
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
INVOCATION = re.compile(r"([A-Za-z_]\w*=\S*\s+)*(\S*/)?boltbeam\s")   # an inline span that runs boltbeam
PATH = re.compile(r"[\w.\-]*(/[\w.\-]*)+")
MD = MarkdownIt("commonmark").enable("table")


def walk(tokens):
    for t in tokens:
        yield t
        yield from walk(t.children or [])


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    tokens = MD.parse(text)
    return {slug("".join(c.content for c in tokens[i + 1].children if c.type in ("text", "code_inline")))
            for i, t in enumerate(tokens) if t.type == "heading_open"}


def broken_links(path: pathlib.Path, text: str) -> list[str]:
    """Relative links and images of `text` (the file at `path`) whose file or heading does not exist."""
    broken = []
    for t in walk(MD.parse(text)):
        target = t.attrGet("href") if t.type == "link_open" else t.attrGet("src") if t.type == "image" else None
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):    # none, or a URL with a scheme
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.is_file():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
            broken.append(f"{target}: no such heading")
    return broken


def missing_paths(text: str) -> list[str]:
    """Code spans naming a path of this repository (`bench/h200/`, `boltbeam/data/spaces.toml`; from its root)
    that does not exist, or a path outside it. Spans under other roots (an output like `audit/trace.json`)
    are not checked."""
    missing = []
    for span in inline_code(text):
        if not PATH.fullmatch(span) or span.startswith("/"):
            continue
        where = pathlib.Path(os.path.normpath(ROOT / span))
        if not where.is_relative_to(ROOT):
            missing.append(f"{span}: outside the repository")
        elif (ROOT / span.split("/")[0]).exists() and not where.exists():
            missing.append(f"{span}: no such file or folder")
    return missing


def code_lines(text: str) -> list[str]:
    """The commands of the fenced code blocks, in order: `$ `-prompted lines of a console block, every
    line but comments of the others."""
    lines = []
    for t in walk(MD.parse(text)):
        if t.type == "fence":
            console = t.info.strip() == "console"
            lines += [ln[2:] if console else ln.strip() for ln in t.content.splitlines()
                      if (ln.startswith("$ ") if console else ln.strip() and not ln.strip().startswith("#"))]
    return lines


def inline_code(text: str) -> list[str]:
    return [t.content for t in walk(MD.parse(text)) if t.type == "code_inline"]


def boltbeam_argvs(command: str) -> list[list[str]]:
    """The argument lists of every `boltbeam` a shell line runs (between operators such as `&&`, past
    VAR=value assignments, not counting a redirect's target)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    argvs, run, after = [], [], None
    for word in [*lexer, ";"]:
        if not SHELL_OPERATOR.fullmatch(word):
            run.append(word)
            continue
        if after not in (">", ">>", "<"):
            while run and ASSIGNMENT.fullmatch(run[0]):
                run = run[1:]
            if run and pathlib.PurePath(run[0]).name == "boltbeam":
                argvs.append(run[1:])
        run, after = [], word
    return argvs


def unparsed(argv: list[str]) -> str | None:
    """argparse's one line on why `boltbeam ARGV` is not a valid command line; None when it parses."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            build_parser().parse_args(argv)
    except SystemExit:
        return said.getvalue().strip() or "exit"
    return None


def table_problems(text: str) -> list[str]:
    """Rows with more or fewer cells than their header (an unescaped `|` splits a cell, and a renderer
    drops what spills over), and cells over MAX_CELL characters."""
    problems, lines, tokens = [], text.splitlines(), MD.parse(text)
    for t in tokens:
        if t.type == "table_open":
            rows = lines[t.map[0]:t.map[1]]
            widths = [len(re.split(r"(?<!\\)\|", row.strip().strip("|"))) for row in rows]
            problems += [f"line {t.map[0] + 1 + n}: {w} cells, the header has {widths[0]}"
                         for n, w in enumerate(widths) if w != widths[0]]
    for i, t in enumerate(tokens):
        if t.type in ("th_open", "td_open") and len(cell := tokens[i + 1].content) > MAX_CELL:
            problems.append(f"a cell of {len(cell):,} characters: {cell[:60]}...")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_and_paths_resolve(path):
    assert path.is_file()
    text = path.read_text()
    assert broken_links(path, text) + missing_paths(text) == []


def test_docs_are_linked_from_the_readme():
    linked = {t.attrGet("href") for t in walk(MD.parse(README.read_text())) if t.type == "link_open"}
    assert {"docs/cli.md", "docs/design.md", "bench/h200/README.md"} <= linked


@pytest.mark.parametrize("path", DOCS[:2], ids=lambda p: p.name)
def test_shown_commands_parse(path):
    """Every `boltbeam` command in a fenced block parses with the real parser; in the README, every inline
    one too (the reference's inline spans may be synopses, like `ledger list [--candidate ID]`)."""
    text = path.read_text()
    shown = code_lines(text) + ([c for c in inline_code(text) if INVOCATION.match(c)] if path == README else [])
    failures, runs = [], 0
    for line in shown:
        try:
            argvs = boltbeam_argvs(line)
        except ValueError as e:                    # the shell could not even split it
            failures.append((line, str(e)))
            continue
        runs += len(argvs)
        failures += [(" ".join(argv), why) for argv in argvs if (why := unparsed(argv))]
    assert runs, "no boltbeam command shown"
    assert failures == []


def test_readme_is_short_and_its_tables_render_whole():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    assert table_problems(text) == []


def test_readme_starts_with_the_commands_a_newcomer_and_ci_run():
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert code_lines(README.read_text())[:2] == [FIRST, ci[-1]]


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Each checker finds a planted fault: a missing file or heading, a command argparse refuses, a split
    table row, an overlong cell."""
    (tmp_path / "there.md").write_text("# A heading's text\n")
    page = tmp_path / "page.md"
    assert broken_links(page, "[a](there.md#a-headings-text) [b](gone.md) [c](there.md#nowhere) [d](https://x.y)") == [
        "gone.md: no such file", "there.md#nowhere: no such heading"]
    assert missing_paths("`bench/h200/` `bench/nowhere.json` `../shared/DESIGN.md` `out/trace.json` `a b/c`") == [
        "bench/nowhere.json: no such file or folder", "../shared/DESIGN.md: outside the repository"]
    assert boltbeam_argvs("A=1 .venv/bin/boltbeam targets > t.txt && boltbeam bound --target h200") == [
        ["targets"], ["bound", "--target", "h200"]]
    assert unparsed(["bound", "--target", "h200"]) is None
    assert "--context" in unparsed(["bound", "--target", "h200", "--context", "N"])
    table = "| a | b |\n| --- | --- |\n| `x|y` | z |\n| " + "w" * (MAX_CELL + 1) + " | v |\n"
    assert [p.split(":")[0] for p in table_problems(table)] == ["line 3", f"a cell of {MAX_CELL + 1:,} characters"]


def flags_of(parser) -> dict[str, set[str]]:
    """Each command's long options, by its name (`import chrome`, `ledger add` for the nested ones)."""
    flags = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                flags |= {f"{name} {k}".strip(): v for k, v in flags_of(sub).items()}
    own = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    return flags | ({"": own} if own else {})


def test_the_reference_lists_every_flag():
    """docs/cli.md has a section for each command, and it names every flag `--help` gives."""
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", (ROOT / "docs" / "cli.md").read_text(), re.M | re.S))
    top = {k: v for k, v in flags_of(build_parser()).items() if k}
    missing = {command: sorted(f for f in flags if f not in sections.get(command.split()[0], ""))
               for command, flags in top.items()}
    assert {c for c in top if c.split()[0] not in sections} == set(), "a command without its `## NAME` section"
    assert {c: m for c, m in missing.items() if m} == {}, "flags its docs/cli.md section does not list"
