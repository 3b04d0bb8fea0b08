"""Plotting: the figure's lines carry the CSV's numbers; dashed = train loss, solid = error."""

from __future__ import annotations

import os

import numpy as np
import pytest

from keras_preact import cli, plotting, rundir

HEADER = "epoch,step,lr,loss,accuracy,val_loss,val_accuracy\n"


def write_run(tmp_path, name, rows, header=HEADER):
    run_dir = tmp_path / name
    run_dir.mkdir()
    lines = [",".join(str(v) for v in row) for row in rows]
    (run_dir / "metrics.csv").write_text(header + "\n".join(lines) + "\n")
    return run_dir


@pytest.fixture
def two_runs(tmp_path):
    a = write_run(tmp_path, "resnet-110", [
        (1, 391, 0.1, 1.5, 0.45, 1.4, 0.50),
        (2, 782, 0.1, 1.0, 0.65, 1.1, 0.62),
        (3, 1173, 0.01, 0.7, 0.75, 0.9, 0.70),
    ])
    b = write_run(tmp_path, "preact-110", [
        (1, 391, 0.1, 1.4, 0.48, 1.3, 0.55),
        (2, 782, 0.1, 0.9, 0.68, 1.0, 0.66),
        (3, 1173, 0.01, 0.6, 0.79, 0.8, 0.75),
    ])
    return a, b


def lines_by_label(fig):
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def test_plot_runs_lines_carry_the_metrics(two_runs, tmp_path):
    fig = plotting.plot_runs(two_runs)
    lines = lines_by_label(fig)

    loss = lines["preact-110 train loss"]
    np.testing.assert_allclose(loss.get_xdata(), [391, 782, 1173])
    np.testing.assert_allclose(loss.get_ydata(), [1.4, 0.9, 0.6])
    assert loss.get_linestyle() == "--"

    error = lines["resnet-110 val error"]
    np.testing.assert_allclose(error.get_ydata(), [50.0, 38.0, 30.0])  # 100 - 100 * val_acc
    assert error.get_linestyle() == "-"

    # One colour per run across loss, error and lr; different runs, different colours.
    for run in ("resnet-110", "preact-110"):
        colours = {lines[f"{run} train loss"].get_color(), lines[f"{run} val error"].get_color(),
                   lines[run].get_color()}
        assert len(colours) == 1
    assert lines["resnet-110"].get_color() != lines["preact-110"].get_color()
    np.testing.assert_allclose(lines["resnet-110"].get_ydata(), [0.1, 0.1, 0.01])
    assert fig.axes[1].get_yscale() == "log"
    assert fig.axes[2].get_ylabel() == "validation error % (solid)"  # the error axis says which


def test_a_run_of_one_logged_epoch_is_drawn_with_markers(tmp_path, two_runs):
    """The README's first run logs one metrics row: its lines through one point drew empty
    axes. A run of one row is drawn as markers; longer runs stay plain lines."""
    first = write_run(tmp_path, "first-try", [(1, 100, 0.1, 2.1, 0.22, 2.0, 0.25)])
    lines = lines_by_label(plotting.plot_runs([first, two_runs[0]]))
    for label in ("first-try train loss", "first-try val error", "first-try"):
        assert lines[label].get_marker() == "o" and len(lines[label].get_xdata()) == 1
    assert lines["resnet-110 train loss"].get_marker() == "None"
    np.testing.assert_allclose(lines["first-try val error"].get_ydata(), [75.0])


def test_a_run_without_a_validation_slice_plots_its_test_error(tmp_path, two_runs):
    # What the trainer writes with --val-examples 0 (rundir.METRICS_COLUMNS)
    run = write_run(tmp_path, "preact-20", [(0, 390, 0.1, 1.8, 0.31, "", "", 1.6, 0.41),
                                            (1, 780, 0.1, 1.4, 0.50, "", "", 1.2, 0.57)],
                    header=",".join(rundir.METRICS_COLUMNS) + "\n")
    lines = lines_by_label(plotting.plot_runs([run]))
    np.testing.assert_allclose(lines["preact-20 test error"].get_ydata(), [59.0, 43.0])
    assert "preact-20 val error" not in lines
    fig = plotting.plot_runs([run, two_runs[0]])
    assert fig.axes[2].get_ylabel() == "test / validation error % (solid)"


def test_plot_runs_writes_image_atomically(two_runs, tmp_path):
    out = tmp_path / "figs" / "curves.png"
    plotting.plot_runs(two_runs, out, labels=["original", "pre-act"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(out.parent) == ["curves.png"]  # no temp file left behind


def test_missing_val_columns_plot_loss_only(tmp_path):
    rows = [(1, 10, 0.1, 2.0, 0.3, "", ""), (2, 20, 0.1, 1.8, 0.35, "", "")]
    run = write_run(tmp_path, "no-val", rows)
    fig = plotting.plot_runs([run])
    assert set(lines_by_label(fig)) == {"no-val train loss", "no-val"}
    assert fig.axes[2].get_ylabel() == "error % (solid)"


def test_errors_name_the_problem(tmp_path, two_runs):
    with pytest.raises(FileNotFoundError, match="No metrics.csv in run directory"):
        plotting.plot_runs([tmp_path])
    with pytest.raises(ValueError, match="Valid extensions"):
        plotting.plot_runs(two_runs, tmp_path / "curves.nope")
    with pytest.raises(ValueError, match="2 run directories"):
        plotting.plot_runs(two_runs, labels=["one"])


def test_cli_plot(two_runs, tmp_path, capsys):
    out = tmp_path / "cli.png"
    assert cli.main(["plot", *map(str, two_runs), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["plot", str(tmp_path), "-o", str(out)]) == 2
    assert "keras-preact plot: error: No metrics.csv" in capsys.readouterr().err
    # An unwritable folder (/sys refuses new files, even to root): the error names -o, not
    # the hidden temporary file it was written as.
    assert cli.main(["plot", *map(str, two_runs), "-o", "/sys/z.png"]) == 2
    assert capsys.readouterr().err == ("keras-preact plot: error: [Errno 13] Permission denied: "
                                       "'/sys/z.png'\n")


def test_plot_signal_propagation_lines_and_stage_marks(tmp_path):
    stats = {
        "identity": {
            "stage": np.array([1, 1, 2, 2]),
            "signal": np.array([1.0, 1.5, 1.2, 1.8]),
            "gradient": np.array([4.0, 2.0, 2.0, 1.0]),
            "direct": np.array([0.9, 1, 0.95, 1]),
        },
        "scaled": {
            "stage": np.array([1, 1, 2, 2]),
            "signal": np.array([1.0, 1.1, 1.0, 1.1]),
            "gradient": np.array([4.0, 3.0, 2.0, 1.5]),
            "direct": np.array([0.5, 1, 0.5, 1]),
        },
    }
    fig = plotting.plot_signal_propagation(stats, tmp_path / "signal.svg")
    signal_ax, gradient_ax, direct_ax = fig.axes
    lines = {line.get_label(): line for line in direct_ax.get_lines()}
    np.testing.assert_allclose(lines["scaled"].get_ydata(), [0.5, 1, 0.5, 1])
    np.testing.assert_allclose(lines["scaled"].get_xdata(), [1, 2, 3, 4])
    assert signal_ax.get_yscale() == "log"
    # One stage boundary, between units 2 and 3.
    marks = [line.get_xdata()[0] for line in gradient_ax.get_lines() if line.get_linestyle() == ":"]
    assert marks == [2.5]
    assert (tmp_path / "signal.svg").read_text().startswith("<?xml")


def test_plot_prediction_shows_image_and_ranked_scores():
    image = np.zeros((32, 32, 3), "uint8")
    image[:, :16] = 255
    fig = plotting.plot_prediction(image, [b"ship", b"airplane", b"truck"], [0.6, 0.3, 0.1])
    ax_image, ax_bars = fig.axes
    np.testing.assert_array_equal(ax_image.get_images()[0].get_array(), image)
    assert [t.get_text() for t in ax_bars.get_yticklabels()] == ["ship", "airplane", "truck"]
    np.testing.assert_allclose([bar.get_width() for bar in ax_bars.patches], [0.6, 0.3, 0.1])
    with pytest.raises(ValueError, match="2 labels for 3 scores"):
        plotting.plot_prediction(image, ["a", "b"], [0.5, 0.3, 0.2])


@pytest.mark.parametrize("text, message", [
    ("epoch,step,lr,loss\n", "has no rows yet"),
    ("epoch,step,lr,loss\n0,10,0.1,abc\n", "column 'loss' holds 'abc', not a number"),
])
def test_unreadable_metrics_name_the_file(text, message, tmp_path, capsys):
    (tmp_path / "metrics.csv").write_text(text)
    assert cli.main(["plot", str(tmp_path), "-o", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"keras-preact plot: error: {tmp_path}/metrics.csv") and message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "c.png").exists()


def test_written_files_follow_the_umask(tmp_path):
    from keras_preact.files import atomic_write

    old = os.umask(0o022)
    try:
        path = atomic_write(str(tmp_path / "a.png"), lambda f: f.write(b"x"), binary=True)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644
