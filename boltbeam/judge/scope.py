"""A verdict's scope: what it holds for, as the ledger stores it (a JSON object in each entry).

Every key the code writes into a scope or reads from one is named once, in ScopeKey; a person's
`ledger add --scope KEY=VALUE` may add any other. A step that makes a scope builds a frozen record and
stores its `as_json()`: the judge's is JudgedScope (here, since the judge comes before the ledger and
the search), the kernel search's `Scope` (search/decide.py), the whole-token search's `TokenScope`
and `FamilyScope` (search/choose.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ScopeKey:
    # what a judgement holds for (JudgedScope)
    MODEL_SHA256 = "model_sha256"
    TARGET = "target"                  # the judge's: the trace's device; the search's: the target's name
    WORKLOAD = "workload"              # {context, batch}
    CONTEXT = "context"                # KV depth
    BATCH = "batch"
    COMPILER = "compiler"
    COMPILER_VERSION = "compiler_version"
    # where the search timed or judged a setting
    DEVICE = "device"
    ENGINE = "engine"
    FAMILY = "family"
    SETTING = "setting"
    KERNEL = "kernel"                  # the kernel's key
    KERNEL_NAME = "kernel_name"
    REPS = "reps"
    BEAM = "beam"
    TOKENS = "tokens"
    PROCESSES = "processes"            # processes a side a whole-token verdict was judged on (stored where above 1)
    DECISIVE = "decisive"              # the first pair's change that settled such a verdict on it (search/choose.py)
    ON = "on"                          # the label of the route a whole-token setting went on
    ROUTE = "route"                    # what that route sets of each whole-token family
    REFERENCE = "reference"            # the reference engine's tokens the output was held to
    # what it found
    MEASURED_US = "measured_us"
    REFUSED = "refused"                # the compiler's refusal, in place of a time
    PREDICTED_US = "predicted_us"
    MEDIAN_US = "median_us"
    BASELINE_MEDIAN_US = "baseline_median_us"
    # an idea's kind and format, which a person's entry may name (ledger/store.py IDEA_KEYS)
    KERNEL_KIND = "kernel_kind"
    FORMAT = "format"


@dataclass(frozen=True)
class JudgedScope:
    """What a judgement holds for: the model, the target, the workload, the compiler and its version."""
    model_sha256: str | None
    target: str | None
    context: int | None
    batch: int | None
    compiler: str | None
    compiler_version: str | None

    def as_json(self) -> dict[str, Any]:
        return {ScopeKey.MODEL_SHA256: self.model_sha256, ScopeKey.TARGET: self.target,
                ScopeKey.WORKLOAD: {ScopeKey.CONTEXT: self.context, ScopeKey.BATCH: self.batch},
                ScopeKey.COMPILER: self.compiler, ScopeKey.COMPILER_VERSION: self.compiler_version}
