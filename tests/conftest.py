"""Shared pytest fixtures."""

import pathlib

import pytest

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
