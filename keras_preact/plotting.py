"""Training curves in the style of the paper's Fig. 1 and Fig. 6.

Each run directory holds the trainer's metrics CSV (`keras_preact.rundir`: one row per
epoch, `step` = optimizer iterations).
`plot_runs` overlays runs: training loss dashed (left axis), error solid (right axis: on the
official test split where the run recorded it, as the paper's figures do, else on the slice of
train it held out), one colour per run, and the learning rate below. Figures are drawn on a plain
`matplotlib.figure.Figure` with the Agg canvas, so no GUI backend and no global pyplot
state is touched (notebooks still display the returned figure inline).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from keras_preact.files import atomic_write
from keras_preact.labels import as_list
from keras_preact.rundir import METRICS, METRICS_COLUMNS


def read_metrics(run_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads `RUN_DIR/metrics.csv` into float arrays keyed by column (empty cells -> NaN).

    Example:
    >>> m = read_metrics("runs/preact-110")  # doctest: +SKIP
    >>> m["step"][-1], 100 - 100 * m["val_accuracy"][-1]  # doctest: +SKIP
    (64000.0, 6.37)
    """
    path = os.path.join(os.fspath(run_dir), METRICS)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"No {METRICS} in run directory {os.fspath(run_dir)!r}: expected the file "
            f"the trainer writes there (`keras-preact train ... --output RUN_DIR`)."
        )
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("step", "loss") if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{path} lacks column(s) {missing}. Expected header: "
                f"{','.join(METRICS_COLUMNS)}. Received: {reader.fieldnames}"
            )
        rows = list(reader)
    if not rows:
        raise ValueError(f"{path} has no rows yet: the trainer adds one per finished epoch.")
    columns = {}
    for column in reader.fieldnames:
        try:
            columns[column] = np.array([float(row[column]) if row[column] else np.nan
                                        for row in rows])
        except (TypeError, ValueError):
            bad = next(row[column] for row in rows if not _is_number(row[column]))
            raise ValueError(f"{path}: column {column!r} holds {bad!r}, not a number.") from None
    return columns


def _is_number(text) -> bool:
    try:
        float(text or "nan")  # empty cells are NaN
        return True
    except (TypeError, ValueError):
        return False


def error_percent(accuracy: np.ndarray) -> np.ndarray:
    """Classification error in percent, as the paper plots it: 100 - 100 * accuracy."""
    return 100.0 - 100.0 * np.asarray(accuracy, dtype=float)


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    output: str | os.PathLike | None = None,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Overlays the training curves of several runs, Fig. 1/6 style.

    Top panel: training loss (dashed, left axis) and error % (solid, right axis: test error
    where the run recorded it, `test_accuracy`, else validation error) vs iterations, the
    same colour per run. Bottom panel: learning rate vs iterations.

    Args:
        run_dirs: directories each holding a `metrics.csv`.
        output: if given, the figure is also written there (format from the extension,
            e.g. `.png`, `.pdf`, `.svg`), atomically.
        labels: legend label per run; defaults to each directory's base name.
        title: optional figure title.

    Returns:
        The `matplotlib.figure.Figure`.

    Example:
    >>> fig = plot_runs(["runs/resnet-110", "runs/preact-110"], "curves.png")  # doctest: +SKIP
    """
    run_dirs = [os.fspath(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("`plot_runs` needs at least one run directory. Received: []")
    if labels is None:
        labels = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    labels = as_list(labels)
    if len(labels) != len(run_dirs):
        raise ValueError(
            f"Received {len(labels)} labels for {len(run_dirs)} run directories."
        )
    runs = [read_metrics(d) for d in run_dirs]

    fig = Figure(figsize=(7, 6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    ax_err = ax_loss.twinx()
    errors = set()  # which errors the runs recorded, for the axis label
    for k, (metrics, label) in enumerate(zip(runs, labels)):
        colour = f"C{k % 10}"
        steps = metrics["step"]
        # A line through one point draws nothing: a run of one logged epoch gets markers.
        marker = "o" if len(steps) == 1 else None
        ax_loss.plot(steps, metrics["loss"], "--", color=colour, marker=marker,
                     label=f"{label} train loss")
        for column, name, kind in (("test_accuracy", "test error", "test"),
                                   ("val_accuracy", "val error", "validation")):
            if column in metrics and not np.all(np.isnan(metrics[column])):
                ax_err.plot(steps, error_percent(metrics[column]), "-", color=colour,
                            marker=marker, label=f"{label} {name}")
                errors.add(kind)
        if "lr" in metrics:
            # The lr logged for an epoch held through it: a step plot ending at its step.
            ax_lr.plot(steps, metrics["lr"], "-", color=colour, marker=marker, label=label,
                       drawstyle="steps-pre")

    ax_loss.set_ylabel("training loss (dashed)")
    ax_err.set_ylabel(f"{' / '.join(sorted(errors))} error % (solid)".lstrip())
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("iterations")
    lrs = [m["lr"] for m in runs if "lr" in m]
    if lrs and all(np.nanmin(lr) > 0 for lr in lrs):
        ax_lr.set_yscale("log")  # step decays (0.1 -> 0.01 -> 0.001) read best on a log axis
    handles = ax_loss.get_legend_handles_labels()
    twin = ax_err.get_legend_handles_labels()
    ax_loss.legend(handles[0] + twin[0], handles[1] + twin[1], fontsize="small", loc="upper right")
    if title:
        fig.suptitle(title)
    if output is not None:
        save_figure(fig, output)
    return fig


def plot_signal_propagation(
    results: Mapping[str, Mapping[str, Any]],
    output: str | os.PathLike | None = None,
    *,
    title: str | None = None,
) -> Figure:
    """Plots `keras_preact.analysis.signal_propagation` results of several nets, per unit.

    Panels, against the unit index: forward signal RMS (log), gradient RMS (log) and the
    `direct` share of the stage's deepest gradient reaching each unit (Eq. 5: 1 for
    identity shortcuts). Dotted vertical lines mark stage boundaries.

    Args:
        results: legend label -> the dict `signal_propagation` returned.
        output: if given, the figure is also written there, atomically.

    Example:
    >>> from keras_preact import analysis, build
    >>> stats = {u: analysis.signal_propagation(build("preact-20", unit=u))
    ...          for u in ("original", "full-preact")}  # doctest: +SKIP
    >>> fig = plot_signal_propagation(stats, "signal.png")  # doctest: +SKIP
    """
    if not results:
        raise ValueError("`plot_signal_propagation` needs at least one result. Received: {}")
    fig = Figure(figsize=(7, 7), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True)
    for k, (label, stats) in enumerate(results.items()):
        units = np.arange(1, len(stats["signal"]) + 1)
        for ax, key in zip(axes, ("signal", "gradient", "direct")):
            ax.plot(units, stats[key], ".-", color=f"C{k % 10}", label=label)
    stages = np.asarray(next(iter(results.values()))["stage"])
    for ax in axes:
        for boundary in np.nonzero(np.diff(stages))[0] + 1.5:
            ax.axvline(boundary, color="0.6", linestyle=":", linewidth=1)
    axes[0].set(ylabel="signal RMS", yscale="log")
    axes[1].set(ylabel="gradient RMS", yscale="log")
    axes[2].set(ylabel="direct share of\ndeepest gradient", xlabel="residual unit")
    axes[2].axhline(1.0, color="0.3", linewidth=0.8)
    axes[0].legend(fontsize="small", ncol=2)
    if title:
        fig.suptitle(title)
    if output is not None:
        save_figure(fig, output)
    return fig


def plot_prediction(image: np.ndarray, labels: Sequence, scores: Sequence[float], *,
                    title: str | None = None) -> Figure:
    """The image with its top-k labels and scores as bars next to it (best on top).

    Args:
        image: `(height, width, 3)` RGB, uint8 or floats in [0, 255].
        labels: class names, best first; bytes (as served by TF Serving) are decoded.
        scores: their probabilities.

    Example:
    >>> import numpy as np
    >>> fig = plot_prediction(np.zeros((32, 32, 3), "uint8"), [b"cat", b"dog"], [0.7, 0.2])
    >>> [t.get_text() for t in fig.axes[1].get_yticklabels()]
    ['cat', 'dog']
    """
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"`image` must be (height, width, 3). Received shape {image.shape}.")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in as_list(labels)]
    scores = np.asarray(scores, dtype=float)
    if len(names) != len(scores):
        raise ValueError(f"Received {len(names)} labels for {len(scores)} scores.")
    fig = Figure(figsize=(7, 2.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax_image, ax_bars = fig.subplots(1, 2, width_ratios=(1, 1.6))
    ax_image.imshow(image.astype("uint8"), interpolation="nearest")
    ax_image.set_axis_off()
    ax_bars.barh(np.arange(len(names)), scores, color="C0")
    ax_bars.set_yticks(np.arange(len(names)), names)
    ax_bars.invert_yaxis()  # best first, on top
    ax_bars.set(xlim=(0, 1), xlabel="probability")
    for y, score in enumerate(scores):
        ax_bars.text(min(score, 0.8) + 0.02, y, f"{score:.3f}", va="center")
    if title:
        fig.suptitle(title)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> str:
    """Writes `fig` to `path` atomically (temp file in the same directory, then rename).

    The format comes from the extension. Returns the path written.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    supported = FigureCanvasAgg.get_supported_filetypes()
    if ext not in supported:
        raise ValueError(
            f"Cannot tell the image format of {path!r}. Valid extensions: {sorted(supported)}."
        )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return atomic_write(path, lambda f: fig.savefig(f, format=ext, dpi=dpi), binary=True)
