"""benchmarks/backend_speed.py and benchmarks/gpu_check.sh (issue 39, items 4 and 5), at tiny
sizes: the tables they print have their rows, with positive figures."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

sys.path.insert(0, str(BENCHMARKS))
import backend_speed  # noqa: E402
import gpu_check  # noqa: E402


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def _table(stdout: str) -> list[list[str]]:
    """The Markdown table's body rows, split into cells."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]


def test_backend_speed_rows_cover_the_issue():
    """Both nets, three frameworks, both forms on both Keras backends, both precisions."""
    rows = list(backend_speed.configurations())
    assert len(rows) == 2 * 2 * (2 * 2 + 1)
    assert {r[1] for r in rows} == {"tensorflow", "jax", "pytorch"}
    assert ("preact-1001, 32", "jax", "scan", "bfloat16") in {r[:4] for r in rows}
    torch = [r[-1] for r in rows if r[1] == "pytorch"]
    assert all("--torch-config channels-last" in flags for flags in torch)
    assert sum("channels-last-bf16" in flags for flags in torch) == 2


def test_backend_speed_quick(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "backend_speed.py"), "--quick", "--precisions",
         "bfloat16", "--output", str(tmp_path / "r.jsonl")],
        capture_output=True, text=True, env=_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^machine: .+, \d+ cores", done.stdout, re.M), done.stdout
    rows = _table(done.stdout)
    assert [r[1:4] for r in rows] == [
        ["tensorflow", "layers", "bfloat16"], ["tensorflow", "scan", "bfloat16"],
        ["jax", "layers", "bfloat16"], ["jax", "scan", "bfloat16"],
        ["pytorch", "channels_last", "bfloat16"]], done.stdout
    for r in rows:
        assert not r[4].startswith("error"), r
    # The figures from the records, not the table: a fast build rounds to "0.00" there.
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(records) == len(rows)
    for r in records:
        assert all(r[k] > 0 for k in ("build_s", "first_step_s", "images_per_s")), r
    jax_layers = next(r for r in records if r.get("backend") == "jax")
    assert jax_layers["tensorflow_imported"] is False
    assert jax_layers["options"]["jit_compile"] is True
    assert "fastest:" in done.stdout


def test_gpu_check_dry_run():
    """The GPU machine's script, end to end on host CPU devices (`--dry-run`)."""
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "--dry-run"],
                          capture_output=True, text=True, env=_env(), timeout=600)
    runs = [json.loads(line[2:]) for line in done.stdout.splitlines() if line.startswith("# {")]
    assert len(runs) == 4, done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "TensorFlow imported: False" in done.stdout
    rows = _table(done.stdout)
    assert [r[0] for r in rows] == (["preact-164 (depth 20), 8"] * 2
                                    + ["preact-1001 (depth 20), 8"] * 2)
    assert [r[1].split(" ")[0] for r in rows] == ["keras_preact", "PyTorch"] * 2
    for r in rows:
        assert int(r[2]) == gpu_check.DRY_RUN["steps"], r
        assert float(r[3]) > 0 and float(r[4]) > 0, r
        assert float(r[5].split()[0]) > 0 and r[5].endswith("(RSS)"), r
    assert all(float(r[6]) > 0 for r in rows[::2])  # the whole train call
    assert not any(r.get("tensorflow_imported") for r in runs), runs  # as on a GPU machine
    params = {(r["model"], r["trainable_params"]) for r in runs}
    assert len(params) == 2, params  # the same net on both sides


def test_backend_parity_tiny(tmp_path, cifar10_data_dir):
    """benchmarks/backend_parity.py at 2 steps of a depth-8 net: one row per backend, each
    scored on the test split, and each backend's mean."""
    pytest.importorskip("jax")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "backend_parity.py"), "--steps", "2", "--seeds", "0",
         "--data-dir", cifar10_data_dir, "--train-flag=--override=depth=8",
         "--train-flag=--batch-size=16"],
        capture_output=True, text=True, env=_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in _table(done.stdout) if r[0] != "backend"]
    assert [r[:2] for r in rows] == [["tensorflow", "0"], ["jax", "0"]], done.stdout
    assert all(0 <= float(r[2]) <= 100 for r in rows), done.stdout
    assert re.search(r"^jax: mean \d+\.\d\d %", done.stdout, re.M), done.stdout
