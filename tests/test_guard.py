"""Facts, not names: decision code and data files must not key a rule to a model's name or shapes."""
import re
from pathlib import Path

import boltbeam

ROOT = Path(boltbeam.__file__).parent
# Decision code: every pipeline step (the generated route families included) and the data files. The
# CLI (which names the embedded default model's package), the report layer and the synthetic-model
# generator (whose presets are shapes to write, read by no decision) are not decision code.
DECISION = ["read", "bound", "measure", "account", "judge", "ledger", "search", "route", "data"]
# "llama.cpp" and "llama-bench" name an engine and its tool, not a model; so do the identifiers of
# llama.cpp's C API, reached through its Python binding imported as `lc` (lc.llama_decode).
MODEL_NAMES = re.compile(r"qwen|(?<!\blc\.)llama(?![.\-_](?:cpp|bench))|smollm|mistral|mixtral|gemma|phi-?\d|deepseek|falcon|gpt-?oss|olmo|granite",
                         re.IGNORECASE)
# Dimensions that identify particular models (vocabularies, widths) rather than chips or formats.
MODEL_SHAPES = re.compile(r"(?<![\d.])(151936|152064|128256|32000|49152|12288|14336|11008|18944|27648)(?![\d.])")


# A table header of data/architectures.toml names a GGUF architecture (one of gguf's MODEL_ARCH_NAMES): the
# formula llama.cpp fixes for that architecture where the file states no fact of it (the feed-forward's
# activation, the embedding's scale), a format's facts; anywhere else in that file a name is caught as before.
ARCHITECTURE_FACTS = Path("data") / "architectures.toml"


def _architecture_header(relative: Path, line: str) -> bool:
    from gguf.constants import MODEL_ARCH_NAMES
    return relative == ARCHITECTURE_FACTS and line.startswith("[") and line.strip()[1:-1] in MODEL_ARCH_NAMES.values()


def violations(root: Path, dirs: list[str]) -> list[str]:
    found = []
    for d in dirs:
        for path in sorted((root / d).rglob("*")):
            if path.suffix not in (".py", ".toml", ".json") or "__pycache__" in path.parts:
                continue
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if _architecture_header(path.relative_to(root), line):
                    continue
                for pattern in (MODEL_NAMES, MODEL_SHAPES):
                    if m := pattern.search(line):
                        found.append(f"{path.relative_to(root)}:{no}: {m.group(0)!r} in {line.strip()}")
    return found


def test_decision_code_and_data_name_no_model():
    assert violations(ROOT, DECISION) == []


def test_the_guard_catches_a_rule_keyed_to_a_model(tmp_path):
    (tmp_path / "bound").mkdir()
    (tmp_path / "bound" / "rule.py").write_text('if arch == "qwen3": bw *= 2\n')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.toml").write_text("vocab_rule = 151936\n")
    (tmp_path / "measure").mkdir()
    (tmp_path / "measure" / "engine.py").write_text('lc.llama_decode(ctx, batch)  # llama.cpp\nif arch == "llama": x = 1\n')
    found = violations(tmp_path, ["bound", "data", "measure"])
    assert len(found) == 3 and "qwen" in found[0] and "151936" in found[1] and "engine.py:2:" in found[2]


def test_the_guard_lets_an_architecture_table_name_only_its_architecture(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "architectures.toml").write_text('[qwen3]\nactivation = "silu"\n[qwen9x]\nnote = "as qwen3"\n')
    (tmp_path / "data" / "other.toml").write_text("[qwen3]\n")
    found = violations(tmp_path, ["data"])
    assert [f.split(":")[:2] for f in found] == [["data/architectures.toml", "3"], ["data/architectures.toml", "4"],
                                                  ["data/other.toml", "1"]]
