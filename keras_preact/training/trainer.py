"""`train`: the paper's recipe (`TrainConfig`) on `model.fit`, resumable,
through tf.distribute, into a run directory (`keras_preact.rundir`).

`model.keras` is written only when training finished: the trained network as plain Keras
layers, which `keras.saving.load_model` loads without keras_preact (`weights.storage.save_plain`).
Beside it: `net` (the network it fits), `resume` (run lock, resume policy), `evaluation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Sequence

import keras

from keras_preact import host, labels, rundir
from keras_preact.arch.specs import resolve
from keras_preact.data import pipeline, sources
from keras_preact.data.catalog import DatasetInfo
from keras_preact.files import atomic_path
from keras_preact.optim import paper_schedule
from keras_preact.paper import CIFAR_RECIPE, IMAGENET_LR_DROPS
from keras_preact.training import callbacks as run_callbacks
from keras_preact.training import distribute
from keras_preact.training import start as run_start
from keras_preact.training.config import TrainConfig, absolute_paths
from keras_preact.training.net import build_and_compile, check_recompute
from keras_preact.training.resume import check_sessions, resolve_stages, resume_config, run_lock
from keras_preact.weights import records
from keras_preact.weights.storage import save_plain

# The paper warms up for 400 of its 64,000 CIFAR iterations; any other run length keeps that
# share (as the lr drops keep theirs), so a first 100-step try needs no extra flag.
CIFAR_WARMUP_SHARE = CIFAR_RECIPE.warmup_steps / CIFAR_RECIPE.steps


class TrainingStopped(RuntimeError):
    """Training stopped at `step` for a reason the message gives, with what to do; the last
    good backup is kept in RUN_DIR/backup for the rerun to resume from."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class TrainingDiverged(TrainingStopped):
    """The loss became NaN/inf at `step`."""


class WorkerLost(TrainingStopped):
    """A worker of a multi-worker run stopped answering at `step`; the others cannot go on."""


def train(
    model: str,
    config: TrainConfig | None = None,
    *,
    output: str,
    download: bool = True,
    verbose: int = 1,
    connect_timeout: float | None = None,
    class_names: Sequence[str] | None = None,
    **fields,
) -> keras.Model:
    """Trains registered network `model` with the recipe `config` (a `TrainConfig`, its
    fields given as keywords, or both: the keywords replace fields of `config`) into run
    directory `output`; returns the trained model.

    SGD (momentum 0.9, optional Nesterov), weight decay `gradient += weight_decay * w` on all
    parameters, lr `lr` divided by 10 at 50 % and 75 % of `steps` (ImageNet: epochs 30 and 60
    of 90), `warmup_steps` at `warmup_lr` first (default on CIFAR: the paper's 400 of 64,000
    iterations, scaled with `steps`; 0 on ImageNet); `TrainConfig` documents every field.
    With `download`, TFDS downloads and prepares the dataset into `data_dir` if it is not
    there yet (imagenet2012 excepted: its files are a manual download).
    Rerunning the same call after an interruption resumes from `output/backup`.
    `verbose`: 0 silent, 1 a live progress bar over all `steps`, 2 one line per epoch.
    Multi-worker runs wait `connect_timeout` seconds at most for the other workers
    (default `distribute.CONNECT_TIMEOUT_S`).
    `dataset` may also be an image folder, any TFDS image-classification dataset, or a
    `tf.data.Dataset` of unbatched `(uint8 image [h, w, 1|3|4], int label)` pairs with their
    `class_names` (one pass; `val_examples` are held out of its end). `weights` starts from
    trained weights (a published tag, a `.weights.h5` file or a run dir; another class count
    gets a new classifier) with fine-tuning defaults (`config.FINE_TUNE`); `freeze` keeps
    BatchNorm or the whole backbone fixed; `deterministic` gives the same weights every time.
    `stages="auto"` trains full pre-activation nets with scanned stages (`keras_preact.arch.scan`:
    same math, a much faster start and less memory) and other designs as plain layers;
    `model.keras` is always the plain layer graph. Returns the trained, compiled model in
    the form it trained in.

    Example (a few steps of a tiny net; the paper's run is `train("preact-110", output=...)`):
    >>> m = train("preact-20", output="/tmp/run", data_dir="../shared/tensorflow_datasets",
    ...           steps=20, batch_size=32, overrides={"depth": 8})  # doctest: +SKIP
    >>> int(m.optimizer.iterations)  # doctest: +SKIP
    20
    """
    # --- Everything checkable without TensorFlow, before any work. ---
    images = fields.get("dataset")
    if isinstance(images, str):
        images = None
    elif images is not None:  # the caller's tf.data.Dataset
        fields["dataset"] = sources.IN_MEMORY
    config = dataclasses.replace(config or TrainConfig(), **fields).recipe()
    config = dataclasses.replace(config, **absolute_paths(dataclasses.asdict(config)))
    info = _dataset_info(config, images, class_names)
    overrides = config.overrides
    spec = resolve(model, **overrides)
    if info.family is not None and spec.family != info.family:
        raise ValueError(f"Model {model!r} is a {spec.family} network; dataset "
                         f"{config.dataset!r} needs a {info.family} one. "
                         f"Received: model={model!r}, dataset={config.dataset!r}")
    if spec.classes != info.classes and "classes" not in overrides:
        overrides = {**overrides, "classes": info.classes}
        spec = resolve(model, **overrides)
    if spec.classes != info.classes:
        raise ValueError(f"{config.dataset!r} has {info.classes} classes. "
                         f"Received: classes={spec.classes}")
    _check_input_size(spec, spec.family)
    start = None if config.weights is None else run_start.start_from(model, spec,
                                                                      config.weights)
    if os.path.exists(output) and not os.path.isdir(output):
        raise FileExistsError(f"`output` must be a run directory; {output!r} is a file. "
                              "Choose another --output.")
    warmup_steps = config.warmup_steps
    config = dataclasses.replace(
        config, overrides=overrides, stages=_stages(config, spec, output),
        seed=0 if config.deterministic and config.seed is None else config.seed,
        warmup_steps=default_warmup_steps(config.steps, spec.family) if warmup_steps is None
        else warmup_steps)
    check_recompute(model, config.stages, config.recompute)
    if os.path.exists(os.path.join(output, rundir.MODEL)):
        raise FileExistsError(f"{output!r} already holds a finished run ({rundir.MODEL}). "
                              "Choose another --output.")
    check_sessions(output)

    # MWMS sets up collectives at TensorFlow start-up: create the strategy first.
    strat = distribute.select_strategy(config.strategy,
                                       connect_timeout or distribute.CONNECT_TIMEOUT_S)
    chief = distribute.is_chief(strat)
    if config.batch_size % strat.num_replicas_in_sync:
        raise ValueError(f"`batch_size` (global) must be divisible by the "
                         f"{strat.num_replicas_in_sync} replicas. "
                         f"Received: batch_size={config.batch_size}")
    if config.strategy != "tpu" and not distribute.gpu_count():
        host.warn_slow_cpu_settings(config.mixed_precision)
    source = images if images is not None else config.dataset
    base = pipeline.train_base(source)
    if images is not None:
        examples = pipeline.count_examples(images)
    else:
        examples = sources.check_split(config.dataset, base, config.data_dir, download)
        info = _dataset_info(config, images, class_names)  # a TFDS dataset's splits, prepared
    if config.val_examples is None:
        config = dataclasses.replace(config, val_examples=pipeline.default_val_examples(
            info, examples))
    if not config.val_examples + config.batch_size <= examples:
        raise ValueError(f"{config.dataset!r} has {examples} training examples: `val_examples` "
                         f"+ `batch_size` must not exceed that. Received: "
                         f"val_examples={config.val_examples}, batch_size={config.batch_size}")
    train_split, val_split = pipeline.train_val_splits(config.val_examples, base)
    if not config.val_examples and info.val_split:  # the dataset's own validation split
        val_split = info.val_split
    # Without validation, each epoch end is scored on the dataset's held-out split (if any).
    held_out = val_split or (info.eval_split if base == "train" else None)
    if held_out and images is None:
        sources.check_split(config.dataset, held_out, config.data_dir)
    config = dataclasses.replace(config, steps_per_epoch=config.steps_per_epoch or max(1, (
        examples - config.val_examples) // config.batch_size))
    saved = {"model": model, **dataclasses.asdict(config), "family": spec.family,
             "classes": info.classes, "class_names": list(info.class_names),
             "train_split": train_split, "val_split": val_split,
             "replicas": strat.num_replicas_in_sync, "versions": _versions()}
    if verbose:
        print(f"keras-preact: {config.dataset}: {info.classes} classes, training on "
              f"{train_split} ({examples - config.val_examples} images), validating on "
              f"{val_split or held_out or 'nothing'}", flush=True)
    # Non-chief workers write everything into a private temp dir (removed at the end); the
    # chief holds the run dir's lock while it trains (workers of one run share the dir).
    run_dir = output if chief else tempfile.mkdtemp(prefix="keras_preact_worker_")
    with run_lock(output) if chief else contextlib.nullcontext():
        saved = resume_config(output, saved)
        rundir.write_config(run_dir, saved)
        try:
            return _fit(spec, model, config, strat, run_dir, output, chief, source,
                        train_split, val_split, held_out, start, verbose)
        except TrainingDiverged as error:
            rundir.write_config(run_dir, {**saved, "diverged_at_step": error.step})
            raise
        finally:
            if not chief:
                shutil.rmtree(run_dir, ignore_errors=True)


def default_warmup_steps(steps: int, family: str) -> int:
    """The paper's warm-up share of a CIFAR run (400 of 64,000 iterations); none on ImageNet.

    Example:
    >>> default_warmup_steps(64000, "cifar"), default_warmup_steps(100, "cifar")
    (400, 1)
    """
    return round(steps * CIFAR_WARMUP_SHARE) if family == "cifar" else 0


def _fit(spec, model_name, config, strat, run_dir, output, chief, source, train_split,
         val_split, held_out, start, verbose):
    import tensorflow as tf

    if config.deterministic:  # process-wide: TensorFlow has no public way back
        tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(config.seed)  # before the input's random ops are made
    steps, spe = config.steps, config.steps_per_epoch
    size = spec.input_shape[0]
    preprocessing = records.preprocessing_for(spec)
    train_ds = pipeline.train_dataset(source, train_split, config.batch_size, config.data_dir,
                                  image_size=size, seed=config.seed, preprocessing=preprocessing,
                                  deterministic=config.deterministic)
    # Without a slice of train held out, each epoch end is scored on the dataset's own
    # held-out split, for test-error curves like the paper's; no decision is made from them.
    val_ds = None if not held_out else pipeline.eval_dataset(
        source, held_out, config.batch_size, config.data_dir, image_size=size,
        preprocessing=preprocessing)
    schedule = paper_schedule(
        steps, config.lr, config.warmup_steps, config.warmup_lr,
        boundaries=CIFAR_RECIPE.lr_drops if spec.family == "cifar" else IMAGENET_LR_DROPS,
    )
    with strat.scope():
        net = build_and_compile(model_name, schedule, config)
        if start is not None:
            loaded, initialized = run_start.load_start(net, start)
            if verbose:
                print(f"keras-preact: weights {start.weights!r}: loaded {len(loaded)} layers"
                      + (f", initialized {', '.join(initialized)} ({spec.classes} classes, "
                         f"the weights had {start.classes})" if initialized else "")
                      + (f"; frozen: {config.freeze}" if config.freeze != "none" else ""),
                      flush=True)

    # Every worker resumes from the chief's backup; fit continues the epoch it was in.
    backup_dir = os.path.join(output, rundir.BACKUP)
    with strat.scope():
        resumed = run_callbacks.restore_backup(net, backup_dir)
    epochs = math.ceil(steps / spe)
    if resumed is not None and verbose:
        print(f"keras-preact: resuming from step {resumed} of {steps} (backup {backup_dir})"
              + (f"; --deterministic: replaying the input's first {resumed} batches"
                 if config.deterministic else ""), flush=True)
    if resumed and config.deterministic and preprocessing.crop_pct is not None:
        warnings.warn("--deterministic cannot promise the uninterrupted run's weights after "
                      "this resume: ImageNet-size crops draw from stateful generators, which "
                      "a rerun does not replay (CIFAR-size nets' input does).", stacklevel=2)
    if resumed and config.deterministic:
        # fit reads one stream of batches over all epochs; a rerun's starts again at its
        # first batch. Skipping those the run has trained on runs the input's shuffle and
        # augmentation (and their random ops) through them, so that step `resumed + 1`
        # trains on the batch it would have had uninterrupted.
        train_ds = train_ds.skip(resumed)
    guard = run_callbacks.TrainingGuard(steps)
    backup = run_callbacks.RunBackup(backup_dir, every=config.backup_every,
                                     steps_per_epoch=spe, chief=chief, saved_step=resumed)
    callbacks = [guard, backup, keras.callbacks.TensorBoard(os.path.join(run_dir, rundir.LOGS))]
    if val_ds is not None and not val_split:  # first, so every later callback reads test_* for test
        callbacks.insert(0, run_callbacks.RenameLogs(rundir.TEST_COLUMNS))
    sessions = run_callbacks.SessionLog(run_dir, _machine(strat))
    if chief:
        callbacks.append(run_callbacks.MetricsCSV(os.path.join(run_dir, rundir.METRICS),
                                                  schedule))
        callbacks.append(sessions)
    if verbose:
        callbacks.append(run_callbacks.Progress(steps, epochs, live=verbose == 1))

    def kept() -> str:  # what a rerun resumes from, once training stopped
        return (f"the last good backup (step {backup.saved_step}) is kept in {backup_dir}"
                if backup.saved_step is not None else "no backup had been written yet")

    try:  # the datasets shuffle themselves (fit would only warn that it cannot)
        net.fit(train_ds, epochs=epochs, steps_per_epoch=spe, shuffle=False,
                initial_epoch=min((resumed or 0) // spe, epochs), validation_data=val_ds,
                callbacks=callbacks, verbose=0)
    except BaseException as error:
        sessions.record()  # the steps this process made are on record
        lost = distribute.lost_worker(error)
        if lost is None:
            raise
        step = run_callbacks.optimizer_step(net)
        raise WorkerLost(f"Lost {lost}, at step {step}; {kept()}. Restart every worker with "
                         "the same command to resume.", step) from None

    if guard.nan_step is not None:
        raise TrainingDiverged(
            f"Loss became NaN/inf at step {guard.nan_step}; training stopped and {kept()}. "
            f"Rerun with a lower --lr (or a longer --warmup-steps) to resume from it; "
            f"{rundir.CONFIG} records the change.", guard.nan_step,
        )
    # The chief writes model.keras atomically; other workers save into their temp dir.
    with atomic_path(os.path.join(run_dir, rundir.MODEL)) as tmp:
        save_plain(net, tmp)
    if chief:
        shutil.rmtree(backup_dir, ignore_errors=True)
    return net


def _stages(config: TrainConfig, spec, output: str) -> str:
    """The form to train in (`resolve_stages`); frozen layers need the plain layer graph (a
    scanned stage is one layer)."""
    if config.freeze != "none" and config.stages == "scan":
        raise ValueError(f"`freeze` needs the plain layer graph: use stages 'auto' or "
                         f"'layers'. Received: freeze={config.freeze!r}, stages='scan'")
    stages = "layers" if config.freeze != "none" and config.stages == "auto" else config.stages
    return resolve_stages(stages, spec, output)


def _dataset_info(config: TrainConfig, images, class_names) -> DatasetInfo:
    """`config.dataset`'s `DatasetInfo`, or one for the caller's tf.data.Dataset
    `images` with `class_names`, which go only with such images."""
    if images is None:
        if class_names is not None:
            raise ValueError(f"`class_names` go with a tf.data.Dataset: {config.dataset!r} "
                             "names its own classes.")
        return sources.dataset_info(config.dataset, config.data_dir)
    if class_names is None:
        raise ValueError("A tf.data.Dataset of (image, label) needs `class_names` (one per "
                         "label, in label order).")
    names = labels.check_names(class_names, len(labels.as_list(class_names)))
    return DatasetInfo(None, len(names), None, names)


def _machine(strat) -> str:
    """The host line of a session record, with the strategy's replicas and workers."""
    gpus = distribute.gpu_count()
    workers = distribute.cluster_workers()
    return (f"{host.describe()}{f', {gpus} GPU' if gpus else ''}; {type(strat).__name__}, "
            f"replicas: {strat.num_replicas_in_sync}{f', workers: {workers}' if workers else ''}")


def _check_input_size(spec, family: str) -> None:
    """The trainer feeds CIFAR's 32x32 images as they are and crops ImageNet to a square;
    both are RGB."""
    height, width, channels = spec.input_shape
    if channels != 3:
        raise ValueError(f"The datasets' images are RGB: input_shape needs 3 channels. "
                         f"Received: input_shape={spec.input_shape}")
    if family == "cifar" and (height, width) not in ((32, 32), (None, None)):
        raise ValueError(f"CIFAR images are 32x32: train with input_shape (32, 32, 3). "
                         f"Received: input_shape={spec.input_shape}")
    if family == "imagenet" and (height is None or height != width):
        raise ValueError(f"ImageNet training crops squares: input_shape must be (side, side, "
                         f"3). Received: input_shape={spec.input_shape}")


def _versions() -> dict:
    import tensorflow as tf
    import tensorflow_datasets as tfds

    import keras_preact

    return {"keras_preact": keras_preact.__version__, "keras": keras.__version__,
            "tensorflow": tf.__version__, "tensorflow_datasets": tfds.__version__,
            "python": platform.python_version()}


