"""Every environment switch BoltBeam reads or sets, each declared once, in the manner of tinygrad's ContextVars: a
name and what it does. A switch is read when asked, not at import: tests and the processes BoltBeam starts change
the environment after this module is loaded. docs/cli.md lists them all (a test holds it to ALL)."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    name: str
    means: str

    @property
    def value(self) -> str:
        """The switch as set, "" when unset."""
        return os.environ.get(self.name, "")

    @property
    def is_set(self) -> bool:
        """Whether it is set at all (an empty value included)."""
        return self.name in os.environ

    def set(self, value: str) -> None:
        os.environ[self.name] = value


DEV = Switch("DEV", "tinygrad's device (CPU, CUDA); tinygrad reads it when first imported, so BoltBeam sets it from "
                    "--device before")
ROUTE = Switch("BOLTBEAM_ROUTE", "`none`: every route and generated family off (as `--route none`)")
TARGETS = Switch("BOLTBEAM_TARGETS", "more targets files (TOML), separated as PATH is, after --targets")
CUPTI_PER_LAUNCH = Switch("BOLTBEAM_CUPTI_PER_LAUNCH",
                          "`1`: on CUDA, beside each token timed per kernel, one timed per launch (CUPTI's graph "
                          "records), which measures the timing's cost and the launch lines; off by default: it "
                          "crashed cuGraphLaunch on an H200 (bench/h200/models/README.md)")
CACHE_HOME = Switch("XDG_CACHE_HOME", "where the measured `host` target and the repacked layout's planes are kept "
                                     "(default ~/.cache)")
PLANES_CACHE = Switch("BOLTBEAM_PLANES_CACHE", "the folder where the repacked layout's planes are kept (default "
                                               "$XDG_CACHE_HOME/boltbeam/planes); `off`: not kept, each run with the "
                                               "layout repacks the model's weights again")
VISIBLE_DEVICES = Switch("CUDA_VISIBLE_DEVICES", "CUDA's own: the first GPU it names is the one llama.cpp's trace "
                                                 "describes; `tune --workers N` runs its profiles on the first N it "
                                                 "names, one a process")
ALL = (DEV, ROUTE, TARGETS, CUPTI_PER_LAUNCH, CACHE_HOME, PLANES_CACHE, VISIBLE_DEVICES)

# tinygrad's own switches a trace records where they are set: they change the kernels it compiles.
RECORDED = ("BEAM", "JITBEAM", "HALF")


def recorded() -> dict[str, str]:
    return {k: os.environ[k] for k in RECORDED if k in os.environ}
