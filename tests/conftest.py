import pytest

from boltbeam.synth.writer import shape_from, write


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A two-block qwen3-architecture Q4_K_M file with random but valid blocks (about 1 MB)."""
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    write(path, "qwen3", shape_from("tiny"), "q4_k_m")
    return str(path)


@pytest.fixture(scope="session")
def smollm2() -> str:
    from boltbeam.cli.read import default_model
    return default_model()
