"""The search's device work on many GPUs, through Dask (`distributed`).

The coordinator (the `boltbeam search` process) plans: BubbleBeam and FutureSight run on its CPU, and
it is the ledger's one writer. Workers time: each holds one device (a `GPU` resource of 1; locally,
one worker process per GPU, pinned with CUDA_VISIBLE_DEVICES). One worker loads the model and captures
the decode token's kernels; the kernels themselves (tinygrad's ASTs and renderer, a few KB each) then
travel with each task, so no other worker loads the model. A task times one kernel's plan (a setting
and its default on the same device, interleaved: decide.time_kernel), or the judge's pair of whole
tokens. A worker returns records; it never writes the ledger. A task whose worker dies is run again
elsewhere by Dask's scheduler; its records arrive once, with its result.

The capturing worker and the judge's need the model file, and the judge's the output folder, at the
coordinator's paths (one host, or a shared filesystem); the model's SHA-256 is checked before capture.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from boltbeam import switches
from boltbeam.errors import BadInput, Refused
from boltbeam.search.compiler import Captured
from boltbeam.search.decide import Plan, Scope, TimeAll, Timings, time_kernel

RESOURCE = "GPU"         # each worker offers one device under this name; every task asks for one
CONNECT_SECONDS = 10     # to reach a scheduler and hear it answer, and again for the client to connect


@dataclass(frozen=True)
class Job:
    """What the capturing worker needs to rebuild the token the coordinator plans on."""
    model: str
    sha256: str
    device: str
    context: int
    prepare: tuple[Callable, ...] = ()   # the generated route families to build on the loaded model


# --- on a worker ---------------------------------------------------------------------------------

_device = threading.Lock()   # tinygrad is not thread-safe: one device user at a time per process


def _use_device(device: str) -> None:
    """tinygrad takes its device from DEV when first imported; a worker that imported it for another is refused."""
    if "tinygrad" not in sys.modules:
        switches.DEV.set(device)
    from tinygrad import Device
    if Device.DEFAULT != device:
        raise Refused(f"a Dask worker runs tinygrad on {Device.DEFAULT}, not {device}: start it with DEV={device}")


@dataclass(frozen=True)
class WorkerFacts:
    """What the coordinator checks on every worker before anything is timed or recorded."""
    engine: str                  # the compiler, as a route names it
    boltbeam: str
    device_error: str | None     # why the device would not open; None when it did


def worker_facts(device: str) -> WorkerFacts:
    from boltbeam import __version__
    from boltbeam.measure.route import engine
    error = None
    try:
        with _device:
            _use_device(device)
            from tinygrad import Device
            Device[device]   # opens the device: fails where there is none
    except Exception as e:   # noqa: BLE001 - any failure to open it is the fact reported
        error = (str(e).splitlines() or [type(e).__name__])[0][:200]
    return WorkerFacts(engine(), __version__, error)


def capture_kernels(job: Job) -> list[Captured]:
    """The token's distinct kernels, captured on this worker's device, to travel to the others."""
    from boltbeam.files import sha256_file
    from boltbeam.read.census import take_census
    from boltbeam.search.compiler import capture
    with _device:
        _use_device(job.device)
        if not os.path.isfile(job.model) or sha256_file(job.model) != job.sha256:
            raise BadInput(f"a Dask worker does not see the model {job.model} as the coordinator does "
                           f"(missing or another file): give workers the same path")
        return capture(job.model, take_census(job.model), job.device, job.context, prepare=list(job.prepare))


def time_plan(device: str, kernel: Captured, plan: Plan, scope: Scope) -> Timings:
    with _device:
        _use_device(device)
        return time_kernel(kernel, plan, scope)


def profile_pair(model: str, device: str, runs: list[tuple[str, list[str]]]) -> str | None:
    """The judge's whole tokens, one after the other on this worker's device, each in a fresh process
    (tinygrad_run.profile_elsewhere); None when every trace was written, else why one was not."""
    from boltbeam.measure.tinygrad_run import profile_elsewhere
    for out, flags in runs:
        if failed := profile_elsewhere(model, device, out, *flags):
            return f"{out}: {failed}"
    return None


# --- on the coordinator --------------------------------------------------------------------------

def _submit(client, fn: Callable, *args: Any, **kw: Any):
    """A task that always runs (never taken for a finished one of the same name)."""
    return client.submit(fn, *args, key=f"{fn.__name__}-{uuid.uuid4().hex}", pure=False, **kw)


@dataclass
class Cluster:
    """A Dask client whose workers each offer one device, checked: same compiler, same BoltBeam, the
    device opens."""
    client: Any
    workers: list[str]

    def submit(self, fn: Callable, *args: Any, **kw: Any):
        return _submit(self.client, fn, *args, resources={RESOURCE: 1}, **kw)

    def kernels(self, job: Job) -> list[Captured]:
        """The token's kernels, captured once, on one worker."""
        return self.submit(capture_kernels, job).result()

    def time_all(self, device: str, captured: list[Captured]) -> TimeAll:
        by_key = {c.shape.key: c for c in captured}

        def run(plans: list[Plan], scope: Scope) -> Iterator[Timings]:
            from distributed import as_completed
            futures = [self.submit(time_plan, device, by_key[p.key], p, scope, priority=len(plans) - i)
                       for i, p in enumerate(plans)]
            for fut in as_completed(futures):
                yield fut.result()
        return run


def _check(client, device: str) -> list[str]:
    from boltbeam import __version__
    from boltbeam.measure.route import engine
    workers = {a: w for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
               if w.get("resources", {}).get(RESOURCE, 0) >= 1}
    if not workers:
        raise Refused(f"no Dask worker offers a {RESOURCE} resource: start workers with --resources {RESOURCE}=1")
    # As tasks, so the device opens on the thread that will use it (a worker runs its tasks on one thread).
    futures = {a: _submit(client, worker_facts, device, workers=[a], allow_other_workers=False) for a in workers}
    for addr, f in sorted(zip(futures, client.gather(list(futures.values()))), key=lambda af: af[0]):
        if f.engine != engine() or f.boltbeam != __version__:
            raise Refused(f"Dask worker {addr} runs {f.engine} and BoltBeam {f.boltbeam}; this search runs "
                          f"{engine()} and BoltBeam {__version__}: its timings would not hold here")
        if f.device_error:
            raise Refused(f"Dask worker {addr} cannot open {device}: {f.device_error}")
    return sorted(workers)


def _answers(address: str) -> None:
    """Refuse, within CONNECT_SECONDS, an address where no Dask scheduler answers: Dask's client waits on a
    silent listener for ever, and reads an HTTP server's reply as frames of any claimed size."""
    import asyncio

    from distributed.comm import connect
    from distributed.security import Security

    async def identity() -> Any:
        comm = await connect(address, timeout=CONNECT_SECONDS, **Security().get_connection_args("client"))
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()
    try:
        reply = asyncio.run(asyncio.wait_for(identity(), CONNECT_SECONDS))
    except Exception as e:   # noqa: BLE001 - whatever is there, if it is no scheduler, the answer is one line
        raise BadInput(f"cannot reach the Dask scheduler at {address} within {CONNECT_SECONDS} s: "
                       f"{(str(e).splitlines() or [type(e).__name__])[0][:200] or type(e).__name__}") from None
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        raise BadInput(f"{address} answers, but not as a Dask scheduler")


@contextlib.contextmanager
def cluster(device: str, workers: int | None = None, scheduler: str | None = None) -> Iterator[Cluster]:
    """A local cluster of `workers` processes (one per GPU on CUDA) or the existing one at `scheduler`."""
    from distributed import Client, Nanny, Scheduler, SpecCluster
    for name in ("distributed", "tornado"):   # a killed or restarted worker is the scheduler's business
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with contextlib.ExitStack() as stack:
        if scheduler is not None:
            if not scheduler.strip():
                raise BadInput("--scheduler is empty: name the scheduler's address (e.g. tcp://host:8786)")
            _answers(scheduler)
            try:
                client = stack.enter_context(Client(scheduler, timeout=CONNECT_SECONDS))
            except (OSError, ValueError, TypeError) as e:
                raise BadInput(f"cannot reach the Dask scheduler at {scheduler}: "
                               f"{(str(e).splitlines() or [type(e).__name__])[0]}") from None
        else:
            if workers is None or workers < 1:
                raise BadInput("--workers needs a count of 1 or more")
            pin = (lambda i: {"CUDA_VISIBLE_DEVICES": str(i)}) if device == "CUDA" else (lambda i: {})
            specs = {i: {"cls": Nanny, "options": {"nthreads": 1, "resources": {RESOURCE: 1}, "memory_limit": 0,
                                                   "silence_logs": logging.CRITICAL, "env": {"DEV": device, **pin(i)}}}
                     for i in range(workers)}
            local = stack.enter_context(SpecCluster(    # the scheduler's HTTP server on a free port: 8787 may be taken
                workers=specs, scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
                silence_logs=logging.CRITICAL))
            client = stack.enter_context(Client(local))
            client.wait_for_workers(workers)
        yield Cluster(client, _check(client, device))
