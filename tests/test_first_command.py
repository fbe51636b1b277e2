"""The README's first command as a newcomer runs it: a fresh HOME and an empty cache, so `host` is measured
on first use (once, in a child process, before the profile's recorder starts) and the audit still closes."""
import json
import os
import pathlib
import shlex
import subprocess
import sys

from boltbeam.bound.targets import host_cache_path

README = pathlib.Path(__file__).parent.parent / "README.md"


def first_command() -> list[str]:
    """The boltbeam part of the README's first command (after `bash scripts/setup.sh &&`), as written."""
    block = README.read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    line = next(ln for ln in block.splitlines() if ".venv/bin/boltbeam" in ln and not ln.startswith("#"))
    argv = shlex.split(line.split("&&", 1)[1])
    assert argv[0] == ".venv/bin/boltbeam"
    return argv[1:]


def run_first_command(folder: pathlib.Path, record: pathlib.Path) -> None:
    """The README's first command in a fresh HOME (an empty cache) under `folder`, its outcome written to `record`
    (conftest's `first_audit` runs it once a test run; its audit is the default model's profile test_profile reads)."""
    argv = first_command()
    out, home = folder / "audit", folder / "home"
    argv[argv.index("--out") + 1] = str(out)
    home.mkdir(parents=True)
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    done = subprocess.run([sys.executable, "-m", "boltbeam", *argv, "--json"], env=env, capture_output=True,
                          text=True, timeout=1200)
    record.write_text(json.dumps({"argv": argv, "out": str(out), "cache": env["XDG_CACHE_HOME"],
                                  "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr[-3000:]}))


def test_readme_first_command_on_an_empty_cache(first_audit, monkeypatch):
    argv = first_command()
    assert argv[:1] == ["audit"] and argv[argv.index("--target") + 1] == "host"
    assert first_audit.returncode == 0, first_audit.stderr
    out = pathlib.Path(first_audit.out)
    monkeypatch.setenv("XDG_CACHE_HOME", first_audit.cache)
    assert host_cache_path().is_file()                                  # measured on first use, and cached
    assert sorted(p.name for p in out.iterdir()) == ["account.json", "audit.json", "report.html", "trace.json"]
    doc = json.loads((out / "audit.json").read_text())
    assert doc["context"] == int(argv[argv.index("--context") + 1])
    assert json.loads(first_audit.stdout)["report"] == str(out / "report.html")
