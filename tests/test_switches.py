"""The environment switches: declared once (boltbeam/switches.py), reached nowhere else, and all documented."""
import ast
from pathlib import Path

import boltbeam
from boltbeam import switches

ROOT = Path(boltbeam.__file__).parent
DOCS = ROOT.parent / "docs" / "cli.md"


def environment_uses(source: str) -> list[int]:
    """Lines of `os.environ` or `os.getenv` used other than whole, to pass the environment on to a child
    (`{**os.environ, ...}`)."""
    tree = ast.parse(source)
    passed = {id(v) for node in ast.walk(tree) if isinstance(node, ast.Dict)
              for k, v in zip(node.keys, node.values) if k is None}
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                  and node.attr in ("environ", "getenv", "putenv", "unsetenv") and id(node) not in passed)


def test_the_environment_is_reached_only_through_switches():
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(ROOT.rglob("*.py")) if p.name != "switches.py"
             for line in environment_uses(p.read_text())]
    assert found == []


def test_the_check_catches_a_read_and_a_write_but_not_a_child_environment():
    assert environment_uses("import os\nx = os.environ.get('DEV')\nos.environ['DEV'] = 'CPU'\ny = os.getenv('A')\n") \
        == [2, 3, 4]
    assert environment_uses("import os\nenv = {**os.environ, 'DEV': 'CPU'}\n") == []


def test_every_switch_is_documented_with_what_it_does():
    section = DOCS.read_text().split("## Environment switches", 1)[1]
    for s in switches.ALL:
        assert f"`{s.name}`: {s.means}" in section
    assert len({s.name for s in switches.ALL}) == len(switches.ALL)


def test_a_switch_is_read_when_asked(monkeypatch):
    monkeypatch.delenv(switches.ROUTE.name, raising=False)
    assert switches.ROUTE.value == ""
    monkeypatch.setenv(switches.ROUTE.name, "none")
    assert switches.ROUTE.value == "none"
    monkeypatch.setenv("BEAM", "2")
    monkeypatch.delenv("HALF", raising=False)
    assert switches.recorded()["BEAM"] == "2" and "HALF" not in switches.recorded()
