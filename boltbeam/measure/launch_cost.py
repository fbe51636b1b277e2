"""Launch and synchronization cost of this device through tinygrad: a measured fact for the account.

A decode token is one JIT replay: the host runs the model's decode step, launches its graphs, and
waits for the one token it reads back. The time that takes beyond the device span of the token's
kernels is launch and synchronization. It is measured here on synthetic models decoded by
`boltbeam profile` itself (a few depths, a 256-token vocabulary and a short context), so the host
does what it does for any model of that many kernels and the kernels are timed exactly as a real
profile times them. Their width is chosen so the device, not the host, sets the pace, as it does
in a real token: a GPU kernel must move megabytes to outlast its launch (width 4096), while
tinygrad's CPU device already runs each kernel slower than the host launches it (width 256).
Per depth: the plain token minus the device span of the timed tokens, averaged over the token pairs
the account keeps (trace.kept_pairs); a line over the kernels per token, each point weighted by its
precision, gives the cost of a call and of each kernel.

What timing the kernels adds to their span (CUPTI's records on a GPU, tinygrad's timestamps written
from Python on the CPU) is taken back out where the traces measured it apart: brackets around each
token's launches, plain and timed (CUDA events, or the device's own stamps). The facts are then
BRACKETED, and the account takes the same cost out as a line of its own. Where no brackets exist, the
per-kernel figure stays net of the timing's cost, so it is negative where that costs more than a
launch: the account counts the plain token against the timed kernels, and the fact bridges them.
"""
from __future__ import annotations

import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from boltbeam.errors import BadInput
from boltbeam.measure.tinygrad_run import profile_elsewhere
from boltbeam.measure.trace import load, timeline

# Blocks of the calibration models: from a few dozen kernels a token to ~900, so a real token's
# count lies inside the measured range rather than beyond it.
DEPTHS = (2, 16, 48)
WIDTHS = (256, 4096)
BRACKETED = "span less the timing's cost measured by brackets"   # a launch fact's method (targets.Fact)


def width_for(device: str) -> int:
    return 4096 if device.startswith("CUDA") else 256


@dataclass
class LaunchSample:
    blocks: int
    timing: str                # how the calibration profile timed its kernels (trace.TIMINGS)
    kernels: int               # kernels per token
    graphs: int                # graphs launched per token
    plain_wall_us: list[float]
    span_us: list[float]       # device span of each timed token
    lead_us: list[float] | None    # timed tokens: host mark to first kernel, and last kernel to host mark
    trail_us: list[float] | None
    kept: list[int] | None = None  # the token pairs the account would average over (trace.kept_pairs)
    timing_cost_us: list[float] | None = None   # per pair: what the timing added to the device time (brackets)

    def _outside(self) -> list[float]:
        kept = self.kept if self.kept is not None else range(min(len(self.plain_wall_us), len(self.span_us)))
        cost = self.timing_cost_us or [0.0] * len(self.span_us)
        return [self.plain_wall_us[i] - (self.span_us[i] - cost[i]) for i in kept]

    @property
    def outside_us(self) -> float:
        """Plain token minus timed span, averaged over the kept pairs as the account averages its lines."""
        return statistics.fmean(self._outside())

    @property
    def outside_error_us(self) -> float:
        """The standard error of outside_us (a floor of 1 µs: a sample never counts as exact)."""
        xs = self._outside()
        return max(1.0, statistics.stdev(xs) / len(xs) ** 0.5) if len(xs) > 1 else math.inf


@dataclass
class LaunchCost:
    device: str
    width: int
    per_call_us: float         # beyond the device span, per decode step
    per_kernel_us: float       # and per kernel it launches (net of the timing's own cost unless BRACKETED)
    samples: list[LaunchSample]
    method: str | None = None  # BRACKETED when every sample took the timing's measured cost back out

    @property
    def timing(self) -> str:
        return self.samples[0].timing


def measure_launch_cost(device: str, width: int | None = None, tokens: int = 16, depths: tuple[int, ...] = DEPTHS,
                        progress: Callable[[int], None] | None = None) -> LaunchCost:
    """Calibrate, then fit."""
    width = width or width_for(device)
    samples = calibration_samples(device, width, tokens, depths, progress)
    per_call, per_kernel = fit(samples)
    return LaunchCost(device, width, per_call_us=per_call, per_kernel_us=per_kernel, samples=samples,
                      method=BRACKETED if all(s.timing_cost_us for s in samples) else None)


def fit(samples: list[LaunchSample]) -> tuple[float, float]:
    """(µs a call, µs a kernel): a line through plain token minus timed span over kernels per token,
    each point weighted by its precision (1 / standard error): a big calibration model's long, noisy
    tokens do not pull the line away from the small ones' precise points."""
    slope, intercept = np.polyfit([s.kernels for s in samples], [s.outside_us for s in samples], 1,
                                  w=[1 / s.outside_error_us for s in samples])
    if intercept <= 0:
        raise BadInput(f"launch benchmark: the line through {', '.join(f'{s.outside_us:.1f} µs' for s in samples)} "
                       f"(plain token minus timed span at {', '.join(str(s.kernels) for s in samples)} kernels) gives "
                       f"no positive cost per call: the device was too noisy to state one")
    return float(intercept), float(slope)


def calibration_samples(device: str, width: int, tokens: int, depths: tuple[int, ...],
                        progress: Callable[[int], None] | None = None) -> list[LaunchSample]:
    """Decode each calibration model in its own process (tinygrad's hook must precede its first compile)."""
    from boltbeam.synth.writer import write_calibration
    if len(set(depths)) < 2:
        raise BadInput("the launch benchmark needs at least two depths to draw a line")
    if width not in WIDTHS:
        raise BadInput(f"launch benchmark width must be one of {', '.join(map(str, WIDTHS))}")
    samples = []
    with tempfile.TemporaryDirectory(prefix="boltbeam-launch-") as tmp:
        for blocks in depths:
            model, out = Path(tmp) / f"launch-{blocks}.gguf", Path(tmp) / f"launch-{blocks}.json"
            write_calibration(model, width, blocks)
            if failed := profile_elsewhere(model, device, out, "--context", "8", "--tokens", str(tokens), "--no-hash"):
                raise BadInput(f"launch benchmark: decoding a {blocks}-block model failed: {failed}")
            trace = load(str(out))
            samples.append(LaunchSample(blocks, trace.kernel_pass.timing, len(trace.kernels_of_token(0)),
                                        round(statistics.median(trace.kernel_pass.graph_launches)),
                                        trace.token_wall_us, [timeline(ks).span_us for ks in trace.by_token().values()],
                                        trace.kernel_pass.lead_us,
                                        trace.kernel_pass.trail_us, trace.kept_pairs(), trace.timing_cost_us()))
            if progress:
                progress(1)
    return samples
