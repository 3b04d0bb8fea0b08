"""`train` and `evaluate`: the paper's recipe on `model.fit`, resumable, through tf.distribute.

RUN_DIR layout: `config.json` (written at start), `metrics.csv` (one row per epoch),
`logs/` (TensorBoard), `backup/` (while training, with the optimizer state) and, only when
training finished, `model.keras`: the trained network as plain Keras layers, which
`keras.saving.load_model` loads without keras_preact (see `shareable`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import shutil
import tempfile
import warnings

from keras_preact.builder import outputs_logits
from keras_preact.training import callbacks as run_callbacks
from keras_preact.training import data, distribute
from keras_preact.training.optimizer import SGDWithL2
from keras_preact.training.schedule import paper_schedule

MIXED_PRECISION = {"off": None, "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
# The paper warms up for 400 of its 64,000 CIFAR iterations; any other run length keeps that
# share (as the lr drops keep theirs), so a first 100-step try needs no extra flag.
CIFAR_WARMUP_SHARE = 400 / 64000
# Settings that must match for a rerun in the same RUN_DIR to resume (not e.g. the strategy:
# a run may move from one GPU to several machines).
RESUME_KEYS = ("model", "overrides", "dataset", "steps", "batch_size", "lr", "warmup_steps",
               "nesterov", "momentum", "weight_decay", "val_examples", "steps_per_epoch",
               "mixed_precision", "stages")


# Settings a rerun may change to resume a run that diverged (the advice its error gives).
DIVERGED_MAY_CHANGE = ("lr", "warmup_steps", "warmup_lr")


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf at `step`; the last good backup is kept in RUN_DIR/backup."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def train(
    model: str,
    *,
    output: str,
    dataset: str = "cifar10",
    data_dir: str | None = None,
    download: bool = True,
    steps: int = 64000,
    batch_size: int = 128,
    lr: float = 0.1,
    warmup_steps: int | None = None,
    warmup_lr: float = 0.01,
    nesterov: bool = False,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    val_examples: int = 5000,
    steps_per_epoch: int | None = None,
    strategy: str = "auto",
    mixed_precision: str = "off",
    jit_compile: bool = False,
    stages: str = "auto",
    recompute: bool = False,
    backup_every: int = 1000,
    overrides: dict | None = None,
    seed: int | None = None,
    verbose: int = 1,
    connect_timeout: float | None = None,
):
    """Trains registered network `model` with the paper's recipe; returns the trained model.

    SGD (momentum 0.9, optional Nesterov), weight decay `gradient += weight_decay * w` on all
    parameters, lr `lr` divided by 10 at 50 % and 75 % of `steps` (ImageNet: epochs 30 and 60
    of 90), `warmup_steps` at `warmup_lr` first (default on CIFAR: the paper's 400 of 64,000
    iterations, scaled with `steps`; 0 on ImageNet).
    `batch_size` is global, split across replicas; scale `lr` linearly with it (0.1 per 128).
    With `download`, TFDS downloads and prepares CIFAR into `data_dir` if it is not there yet.
    Rerunning the same call after an interruption resumes from `output/backup`.
    `verbose`: 0 silent, 1 a live progress bar over all `steps`, 2 one line per epoch.
    Multi-worker runs wait `connect_timeout` seconds at most for the other workers
    (default `distribute.CONNECT_TIMEOUT_S`, 5 minutes).
    `stages="auto"` trains full pre-activation nets with scanned stages (`keras_preact.scan`:
    same math, a first step in seconds even at depth 1001, less memory) and other designs
    as plain layers; `model.keras` is always the plain layer graph. Returns the trained,
    compiled model in the form it trained in.

    Example (a few steps of a tiny net; the paper's run is `train("preact-110", output=...)`):
    >>> m = train("preact-20", output="/tmp/run", data_dir="../shared/tensorflow_datasets",
    ...           steps=20, batch_size=32, overrides={"depth": 8})  # doctest: +SKIP
    >>> int(m.optimizer.iterations)  # doctest: +SKIP
    20
    """
    import keras_preact

    # --- Everything checkable without TensorFlow, before any work. ---
    info = data.dataset_info(dataset)
    overrides = dict(overrides or {})
    spec = keras_preact.resolve(model, **overrides)
    if spec.family != info.family:
        raise ValueError(f"Model {model!r} is a {spec.family} network; dataset {dataset!r} needs "
                         f"a {info.family} one. Received: model={model!r}, dataset={dataset!r}")
    if spec.classes != info.classes and "classes" not in overrides:
        overrides["classes"] = info.classes
        spec = keras_preact.resolve(model, **overrides)
    if spec.classes != info.classes:
        raise ValueError(f"{dataset!r} has {info.classes} classes. Received: classes={spec.classes}")
    _check_positive(steps=steps, batch_size=batch_size, backup_every=backup_every)
    if warmup_steps is None:
        warmup_steps = default_warmup_steps(steps, info.family)
    if steps_per_epoch is not None:
        _check_positive(steps_per_epoch=steps_per_epoch)
    if not (isinstance(val_examples, int) and val_examples >= 0):
        raise ValueError(f"`val_examples` must be an integer >= 0. Received: {val_examples!r}")
    if not (isinstance(warmup_steps, int) and 0 <= warmup_steps < steps):
        raise ValueError(f"`warmup_steps` must be an integer in [0, steps={steps}). "
                         f"Received: warmup_steps={warmup_steps!r}")
    rates = (lr, warmup_lr, weight_decay, momentum)
    if not (all(math.isfinite(r) for r in rates) and lr > 0 and warmup_lr > 0
            and weight_decay >= 0 and 0 <= momentum < 1):
        raise ValueError(f"Need finite lr > 0, warmup_lr > 0, weight_decay >= 0, 0 <= momentum "
                         f"< 1. Received: lr={lr}, warmup_lr={warmup_lr}, "
                         f"weight_decay={weight_decay}, momentum={momentum}")
    _check_input_size(spec, info.family)
    if os.path.exists(output) and not os.path.isdir(output):
        raise FileExistsError(f"`output` must be a run directory; {output!r} is a file. "
                              "Choose another --output.")
    stages = resolve_stages(stages, spec, output)
    _check_compile_options(model, stages, recompute, mixed_precision)
    if strategy not in distribute.STRATEGIES:
        raise ValueError(f"Unknown strategy {strategy!r}. Valid: {list(distribute.STRATEGIES)}.")
    if os.path.exists(os.path.join(output, "model.keras")):
        raise FileExistsError(f"{output!r} already holds a finished run (model.keras). "
                              "Choose another --output.")

    # MWMS sets up collectives at TensorFlow start-up: create the strategy first.
    strat = distribute.select_strategy(strategy, connect_timeout or distribute.CONNECT_TIMEOUT_S)
    chief = distribute.is_chief(strat)
    if batch_size % strat.num_replicas_in_sync:
        raise ValueError(f"`batch_size` (global) must be divisible by the "
                         f"{strat.num_replicas_in_sync} replicas. Received: {batch_size}")
    if mixed_precision == "float16" and not distribute.has_gpu():
        warnings.warn("float16 has no fast kernels on CPUs and runs far slower than float32: "
                      "use --mixed-precision bfloat16 (CPUs with AMX or AVX512-BF16) or off.",
                      stacklevel=2)
    examples = data.check_split(dataset, "train", data_dir, download)
    if not val_examples + batch_size <= examples:
        raise ValueError(f"{dataset!r} has {examples} training examples: `val_examples` + "
                         f"`batch_size` must not exceed that. Received: "
                         f"val_examples={val_examples}, batch_size={batch_size}")
    train_split, val_split = data.train_val_splits(val_examples)
    steps_per_epoch = steps_per_epoch or (examples - val_examples) // batch_size

    config = {
        "model": model, "overrides": overrides, "dataset": dataset, "family": info.family,
        "classes": info.classes, "data_dir": data_dir, "steps": steps,
        "batch_size": batch_size, "lr": lr, "warmup_steps": warmup_steps,
        "warmup_lr": warmup_lr, "nesterov": nesterov, "momentum": momentum,
        "weight_decay": weight_decay, "val_examples": val_examples,
        "steps_per_epoch": steps_per_epoch, "strategy": strategy,
        "replicas": strat.num_replicas_in_sync, "mixed_precision": mixed_precision,
        "jit_compile": jit_compile, "stages": stages, "recompute": recompute,
        "backup_every": backup_every, "seed": seed,
        "versions": _versions(),
    }
    # Non-chief workers write everything into a private temp dir (removed at the end); the
    # chief holds the run dir's lock while it trains (workers of one run share the dir).
    run_dir = output if chief else tempfile.mkdtemp(prefix="keras_preact_worker_")
    with run_lock(output) if chief else contextlib.nullcontext():
        config = _resume_config(output, config)
        _write_config(run_dir, config)
        try:
            return _fit(spec, model, overrides, config, strat, run_dir, output, chief,
                        train_split, val_split, seed, verbose)
        except TrainingDiverged as error:
            _write_config(run_dir, {**config, "diverged_at_step": error.step})
            raise
        finally:
            if not chief:
                shutil.rmtree(run_dir, ignore_errors=True)


def _write_config(run_dir: str, config: dict) -> None:
    run_callbacks.atomic_write_text(os.path.join(run_dir, "config.json"),
                                    json.dumps(config, indent=2, default=list) + "\n")


def default_warmup_steps(steps: int, family: str) -> int:
    """The paper's warm-up share of a CIFAR run (400 of 64,000 iterations); none on ImageNet.

    Example:
    >>> default_warmup_steps(64000, "cifar"), default_warmup_steps(100, "cifar")
    (400, 1)
    """
    return round(steps * CIFAR_WARMUP_SHARE) if family == "cifar" else 0


def build_and_compile(
    model: str,
    schedule,
    *,
    overrides: dict | None = None,
    stages: str = "layers",
    recompute: bool = False,
    momentum: float = 0.9,
    nesterov: bool = False,
    weight_decay: float = 1e-4,
    mixed_precision: str = "off",
    jit_compile: bool = False,
    steps_per_execution: int = 1,
):
    """The network `train` fits, compiled as `train` compiles it (call in a strategy scope).

    `SGDWithL2` on `schedule`, sparse cross-entropy, accuracy. `stages="scan"` runs each
    stage's identical units as one loop (`keras_preact.scan`: much faster start-up and
    steps for deep full pre-activation nets), `recompute` trades compute for activation
    memory there. benchmarks/train_speed.py measures exactly this function.

    Example:
    >>> net = build_and_compile("preact-20", paper_schedule(100, warmup_steps=0),
    ...                         overrides={"depth": 8})
    >>> type(net.optimizer).__name__
    'SGDWithL2'
    """
    import keras

    import keras_preact
    from keras_preact import scan

    _check_compile_options(model, stages, recompute, mixed_precision)
    previous_policy = keras.config.dtype_policy()
    if MIXED_PRECISION[mixed_precision]:
        keras.config.set_dtype_policy(MIXED_PRECISION[mixed_precision])
    try:
        net = keras_preact.build(model, stages=stages, **(overrides or {}))
    finally:
        keras.config.set_dtype_policy(previous_policy)
    scan.set_options(net, recompute=recompute)
    net.compile(
        optimizer=SGDWithL2(schedule, momentum=momentum, nesterov=nesterov, l2=weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=outputs_logits(net)),
        metrics=["accuracy"],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return net


def _fit(spec, model_name, overrides, config, strat, run_dir, output, chief,
         train_split, val_split, seed, verbose):
    import keras

    import keras_preact

    steps, spe = config["steps"], config["steps_per_epoch"]
    image_size = spec.input_shape[0] if spec.family == "imagenet" else None
    train_ds = data.train_dataset(config["dataset"], train_split, config["batch_size"],
                                  config["data_dir"], image_size=image_size, seed=seed)
    val_ds = None
    if val_split:
        val_ds = data.eval_dataset(config["dataset"], val_split, config["batch_size"],
                                   config["data_dir"], image_size=image_size,
                                   cache=spec.family == "cifar")
    schedule = paper_schedule(
        steps, config["lr"], config["warmup_steps"], config["warmup_lr"],
        boundaries=(0.5, 0.75) if spec.family == "cifar" else (1 / 3, 2 / 3),
    )
    with strat.scope():
        net = build_and_compile(
            model_name, schedule, overrides=overrides, stages=config["stages"],
            recompute=config["recompute"], momentum=config["momentum"],
            nesterov=config["nesterov"], weight_decay=config["weight_decay"],
            mixed_precision=config["mixed_precision"], jit_compile=config["jit_compile"],
        )

    # Every worker resumes from the chief's backup; fit continues the epoch it was in.
    backup_dir = os.path.join(output, "backup")
    with strat.scope():
        resumed = run_callbacks.restore_backup(net, backup_dir)
    epochs = math.ceil(steps / spe)
    if resumed is not None and verbose:
        print(f"keras-preact: resuming from step {resumed} of {steps} (backup {backup_dir})",
              flush=True)
    guard = run_callbacks.TrainingGuard(steps)
    backup = run_callbacks.RunBackup(backup_dir, every=config["backup_every"],
                                     steps_per_epoch=spe, chief=chief, saved_step=resumed)
    callbacks = [guard, backup, keras.callbacks.TensorBoard(os.path.join(run_dir, "logs"))]
    if chief:
        callbacks.append(run_callbacks.MetricsCSV(os.path.join(run_dir, "metrics.csv"), schedule))
    if verbose:
        callbacks.append(run_callbacks.Progress(steps, epochs, live=verbose == 1))
    # The datasets shuffle themselves (fit would only warn that it cannot).
    net.fit(train_ds, epochs=epochs, steps_per_epoch=spe, shuffle=False,
            initial_epoch=min((resumed or 0) // spe, epochs), validation_data=val_ds,
            callbacks=callbacks, verbose=0)

    if guard.nan_step is not None:
        kept = (f"the last good backup (step {backup.saved_step}) is kept in {backup_dir}"
                if backup.saved_step is not None else "no backup had been written yet")
        raise TrainingDiverged(
            f"Loss became NaN/inf at step {guard.nan_step}; training stopped and {kept}. "
            f"Rerun with a lower --lr (or a longer --warmup-steps) to resume from it; "
            f"config.json records the change.", guard.nan_step,
        )
    # The chief writes model.keras atomically; other workers save into their temp dir.
    tmp = os.path.join(run_dir, ".tmp-model.keras")
    shareable(net).save(tmp)
    os.replace(tmp, os.path.join(run_dir, "model.keras"))
    if chief:
        shutil.rmtree(backup_dir, ignore_errors=True)
    return net


def shareable(model):
    """The trained network as a file anyone can load: plain Keras layers (the layer graph of
    a scanned model), without the optimizer, so `keras.saving.load_model` needs neither
    keras_preact nor `safe_mode=False`. The recipe that trained it is in config.json."""
    import keras

    from keras_preact import scan

    if scan.is_scanned(model):
        return scan.to_layered(model)
    twin = keras.Model.from_config(model.get_config())  # the same graph, uncompiled
    twin.set_weights(model.get_weights())
    return twin


def _check_compile_options(model: str, stages: str, recompute: bool,
                           mixed_precision: str) -> None:
    if mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"Unknown mixed_precision {mixed_precision!r}. "
                         f"Valid: {list(MIXED_PRECISION)}.")
    if recompute and stages != "scan":
        raise ValueError(f"`recompute` needs stages='scan' (full pre-activation nets). "
                         f"Received: model={model!r}, stages={stages!r}, recompute=True")


def _saved_config(output: str) -> dict:
    """The config.json of an earlier run in `output`, or {}."""
    path = os.path.join(output, "config.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        config = error
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a keras-preact run config ({config}). Move it away to "
                         "start over, or choose another --output.")
    return config


def resolve_stages(stages: str, spec, output: str | None = None) -> str:
    """The form `train` builds: `"auto"` is the form of an earlier run in `output` (so it
    resumes), else "scan" for the nets it runs (preact-1001: first step 20x sooner, 40 % of
    the memory; benchmarks/README.md), else "layers"."""
    from keras_preact import scan

    valid = ("auto", *scan.STAGES)
    if stages not in valid:
        raise ValueError(f"Unknown stages {stages!r}. Valid: {list(valid)}.")
    if stages == "auto":
        return (output and _saved_config(output).get("stages")) or (
            "scan" if scan.scannable(spec) else "layers")
    if stages == "scan":
        scan.check_scannable(spec)
    return stages


def _resume_config(output: str, config: dict) -> dict:
    """The config a run in `output` continues with: `config`, checked against the run it
    resumes. Only a run with a backup has something to resume (a start that failed before
    its first backup is simply replaced); it resumes with the same recipe, except that a
    diverged run may change `DIVERGED_MAY_CHANGE`, recorded under "changes"."""
    before = _saved_config(output)
    if not before or not os.path.exists(os.path.join(output, "backup", run_callbacks.BACKUP_FILE)):
        return config
    changed = {k: (before.get(k), config[k]) for k in RESUME_KEYS
               if json.loads(json.dumps(before.get(k))) != json.loads(json.dumps(config[k]))}
    allowed = DIVERGED_MAY_CHANGE if "diverged_at_step" in before else ()
    refused = {k: v for k, v in changed.items() if k not in allowed}
    if refused:
        hint = (f" After a divergence only {', '.join(DIVERGED_MAY_CHANGE)} may change."
                if allowed else "")
        raise ValueError(
            f"{output!r} holds a run with other settings; use another --output or the same "
            f"flags to resume.{hint} Received (before -> now): "
            + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        )
    changes = list(before.get("changes", []))
    if changed:
        changes.append({"at_step": before["diverged_at_step"],
                        **{k: list(v) for k, v in changed.items()}})
    return {**config, "changes": changes} if changes else config


@contextlib.contextmanager
def run_lock(output: str):
    """Holds an exclusive lock on run dir `output` (created if needed) while training.

    A second trainer on a live run dir is refused at once. The lock is the kernel's
    (`flock` on the directory), so a killed trainer never leaves it stuck.
    """
    os.makedirs(output, exist_ok=True)
    fd = os.open(output, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileExistsError(f"Another trainer is running in {output!r}; wait for it, or "
                                  "choose another --output.") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _check_input_size(spec, family: str) -> None:
    """The trainer feeds CIFAR's 32x32 images as they are and crops ImageNet to a square."""
    height, width = spec.input_shape[:2]
    if family == "cifar" and (height, width) not in ((32, 32), (None, None)):
        raise ValueError(f"CIFAR images are 32x32: train with input_shape (32, 32, 3). "
                         f"Received: input_shape={spec.input_shape}")
    if family == "imagenet" and (height is None or height != width):
        raise ValueError(f"ImageNet training crops squares: input_shape must be (side, side, "
                         f"3). Received: input_shape={spec.input_shape}")


def _versions() -> dict:
    import keras
    import tensorflow as tf
    import tensorflow_datasets as tfds

    import keras_preact

    return {"keras_preact": keras_preact.__version__, "keras": keras.__version__,
            "tensorflow": tf.__version__, "tensorflow_datasets": tfds.__version__,
            "python": platform.python_version()}


def load_trained(model_or_path):
    """A `keras.Model` from itself, a `.keras` file, or a RUN_DIR holding `model.keras`
    (uncompiled; full pre-activation nets in their scanned form, which loads much faster)."""
    import keras

    from keras_preact.api import load_for_inference

    if isinstance(model_or_path, keras.Model):
        return model_or_path
    return load_for_inference(os.fspath(model_or_path))


def evaluate(model_or_path, *, dataset: str = "cifar10", split: str | None = None,
             data_dir: str | None = None, batch_size: int = 500, download: bool = True) -> dict:
    """Accuracy, error (percent), mean cross-entropy and example count on a TFDS split.

    `split` defaults to the dataset's labelled held-out split (`test` for CIFAR,
    `validation` for imagenet2012, whose `test` split has no labels).

    Uses the shared eval geometry (`preprocessing.resize_for_eval`) and normalization.

    Example:
    >>> evaluate("runs/preact-110", split="test")  # doctest: +SKIP
    {'accuracy': 0.9363, 'error': 6.37, 'loss': 0.29, 'examples': 10000}
    """
    import keras
    import tensorflow as tf

    from keras_preact import preprocessing

    info = data.dataset_info(dataset)
    split = split or info.eval_split
    _check_positive(batch_size=batch_size)
    model = load_trained(model_or_path)  # a wrong path fails before the data is touched
    data.check_split(dataset, split, data_dir, download)
    family = preprocessing.family_of(model)
    if family != info.family or model.output_shape[-1] != info.classes:
        raise ValueError(f"Dataset {dataset!r} needs a {info.family} model with "
                         f"{info.classes} outputs. Received: a {family} model with "
                         f"{model.output_shape[-1]} outputs.")
    size = model.input_shape[1] if family == "imagenet" else None
    ds = data.eval_dataset(dataset, split, batch_size, data_dir, image_size=size)
    from_logits = outputs_logits(model)

    @tf.function
    def batch_totals(images, labels):
        outputs = tf.cast(model(images, training=False), tf.float32)
        losses = tf.keras.losses.sparse_categorical_crossentropy(
            labels, outputs, from_logits=from_logits)
        correct = tf.equal(tf.argmax(outputs, -1), tf.cast(labels, tf.int64))
        return tf.reduce_sum(losses), tf.reduce_sum(tf.cast(correct, tf.float32))

    total_loss = total_correct = 0.0
    examples = 0
    for images, labels in ds:
        loss, correct = batch_totals(images, labels)
        total_loss += float(loss)
        total_correct += float(correct)
        examples += int(labels.shape[0])
    accuracy = total_correct / max(examples, 1)
    return {"accuracy": accuracy, "error": 100.0 * (1.0 - accuracy),
            "loss": total_loss / max(examples, 1), "examples": examples}
