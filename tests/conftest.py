"""Session fixtures, made once a test run and shared by the pytest-xdist workers (addopts runs two): the models,
and the traces of `boltbeam profile` runs that several tests read (each ~15 s of a CPU's time, most of it
tinygrad scheduling the model; a test that needs a fresh process of its own still runs its own)."""
import fcntl
import hashlib
import os
from pathlib import Path

import pytest

from boltbeam.synth.writer import shape_from, write
from tests.processes import once, profile, shared_root


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    return shared_root(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def tiny_model(shared) -> str:
    """A two-block qwen3-architecture Q4_K_M file with random but valid blocks (about 1 MB)."""
    return str(once(shared / "tiny.gguf", lambda path: write(path, "qwen3", shape_from("tiny"), "q4_k_m")))


@pytest.fixture(scope="session")
def smollm2() -> str:
    from boltbeam.cli.read import default_model
    return default_model()


@pytest.fixture(scope="session")
def profiled(shared):
    """profiled(model, *flags): the trace file of `boltbeam profile MODEL --device CPU *flags`, profiled once a
    test run by whichever test asks first. Tests only read it."""
    folder = shared / "traces"
    folder.mkdir(exist_ok=True)

    def trace(model: str, *flags: str):
        key = hashlib.sha256("\0".join([model, *flags]).encode()).hexdigest()[:16]
        return once(folder / f"{key}.json", lambda out: profile(model, out, *flags))
    return trace


def pytest_collection_modifyitems(config, items):
    """A test marked `gpu` runs where tinygrad opens CUDA; on a CPU machine it is skipped and says why."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not _opens_cuda():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs a GPU: tinygrad opens no CUDA device on this machine"))


def _opens_cuda() -> bool:
    from tinygrad import Device
    try:
        Device["CUDA"]
        return True
    except Exception:
        return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked `alone` (it asserts on a CPU's timing) runs, fixtures and all, while no
    other worker runs a test. A readers-writer lock over the workers: a writer waiting at the turnstile holds
    back new readers."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    exclusive = item.get_closest_marker("alone") is not None
    root = Path(item.config.option.basetemp).parent         # the run's folder, above each worker's own
    with open(root / "turnstile.lock", "w") as turnstile, open(root / "tests.lock", "w") as tests:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(tests, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
