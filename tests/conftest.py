"""Shared pytest fixtures."""

import pathlib
import signal

import pytest

from keras_preact import host

# Before any test imports TensorFlow: the suite runs it as the CLI does (tests compare the
# two), with oneDNN on wherever keras_preact.host turns it on.
host.use_onednn()


def pytest_configure(config):
    """A suite started in the background (`pytest ... &` in a script, or a CI runner doing so)
    inherits SIGINT ignored, and so would every process a test starts: the Ctrl-C tests need
    Python's default handler, as a terminal's pytest has."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--run-large", action="store_true",
                     help="also run the tests marked `large` (minutes each, ~10 GB of memory)")


def pytest_collection_modifyitems(config, items):
    """`large` tests (e.g. preact-1001 at full depth through tf2onnx) are skipped unless
    --run-large: the default suite has to fit CI's 30 minutes on 2 cores."""
    if config.getoption("--run-large"):
        return
    skip = pytest.mark.skip(reason="large: run with --run-large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


# Real CIFAR-10 (train split, TFDS format) lives beside the repository, never inside it.
CIFAR10_DATA_DIR = (
    pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "tensorflow_datasets"
)


@pytest.fixture(scope="session")
def cifar10_data_dir() -> str:
    """The TFDS data_dir holding real CIFAR-10 (`tfds.load("cifar10", data_dir=...)`)."""
    if not (CIFAR10_DATA_DIR / "cifar10").is_dir():
        pytest.skip(f"real CIFAR-10 not found at {CIFAR10_DATA_DIR}")
    return str(CIFAR10_DATA_DIR)
