"""`train`: the paper's recipe (`TrainConfig`) on `model.fit`, resumable, on Keras'
TensorFlow backend (through tf.distribute) or its JAX one (`backend`), into a run directory
(`keras_preact.rundir`).

`model.keras` is written only when training finished: the trained network as plain Keras
layers, which `keras.saving.load_model` loads without keras_preact (`weights.storage.save_plain`).
Beside it: `plan` (the run resolved once, before any work: `train`'s arguments checked),
`net` (the network it fits), `resume` (run lock, resume policy), `evaluation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import math
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Sequence

import keras

from keras_preact import rundir
from keras_preact.data import arrays, pipeline
from keras_preact.files import atomic_path
from keras_preact.training import backend, distribute
from keras_preact.training import callbacks as run_callbacks
from keras_preact.training import start as run_start
from keras_preact.training.config import TrainConfig
from keras_preact.training.net import build_and_compile
from keras_preact.training.plan import TrainPlan, default_warmup_steps, make_plan
from keras_preact.training.resume import resume_config, run_lock
from keras_preact.weights import records
from keras_preact.weights.storage import save_plain

__all__ = ["TrainingDiverged", "TrainingStopped", "WorkerLost", "default_warmup_steps",
           "run", "train"]


class TrainingStopped(RuntimeError):
    """Training stopped at `step` for a reason the message gives, with what to do; the last
    good backup is kept in RUN_DIR/backup for the rerun to resume from. `keras-preact train`
    prints it in one line and exits with 1 (a user error exits with 2).

    Example:
    >>> error = TrainingDiverged("Loss became NaN/inf at step 7; ...", 7)
    >>> isinstance(error, TrainingStopped), error.step
    (True, 7)
    """

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
    `dataset` may also be an image folder, any TFDS image-classification dataset, a
    `tf.data.Dataset` of unbatched `(uint8 image [h, w, 1|3|4], int label)` pairs with their
    `class_names` (one pass; `val_examples` are held out of its end), NumPy `(images, labels)`
    (uint8 `[n, 32, 32, 3]`, int `[n]`, with `class_names`: augmented in NumPy, so that a
    JAX machine without TensorFlow trains on them, `data.arrays`), or any of these
    resolved (`data.sources.resolve`). Keras' backend (`KERAS_BACKEND`: TensorFlow or JAX)
    trains it, with the same recipe and run dir (`backend`). `weights` starts from
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
    # Everything is checked and resolved once, before the run dir is written (`plan`).
    plan = make_plan(model, config, output=output, download=download,
                     connect_timeout=connect_timeout, class_names=class_names, **fields)
    return run(plan, verbose=verbose)


def run(plan: TrainPlan, *, verbose: int = 1) -> keras.Model:
    """Runs `plan` (`make_plan`) into its run dir, as `train` documents; returns the model."""
    config, source, output = plan.config, plan.source, plan.output
    chief = plan.strategy.is_chief
    saved = {"model": plan.model, **dataclasses.asdict(config), "family": plan.spec.family,
             "classes": source.info.classes, "class_names": list(source.info.class_names),
             "train_split": plan.train_split, "val_split": plan.val_split,
             "replicas": plan.strategy.num_replicas, "versions": _versions()}
    if verbose:
        print(f"keras-preact: {config.dataset}: {source.info.classes} classes, training on "
              f"{plan.train_split} ({plan.examples - config.val_examples} images), validating "
              f"on {plan.val_split or plan.held_out or 'nothing'}", flush=True)
    # Non-chief workers write everything into a private temp dir (removed at the end); the
    # chief holds the run dir's lock while it trains (workers of one run share the dir).
    run_dir = output if chief else tempfile.mkdtemp(prefix="keras_preact_worker_")
    with run_lock(output) if chief else contextlib.nullcontext():
        saved = resume_config(output, saved)
        rundir.write_config(run_dir, saved)
        try:
            return _fit(plan, run_dir=run_dir, chief=chief, verbose=verbose)
        except TrainingDiverged as error:
            rundir.write_config(run_dir, {**saved, "diverged_at_step": error.step})
            raise
        finally:
            if not chief:
                shutil.rmtree(run_dir, ignore_errors=True)


def _fit(plan: TrainPlan, *, run_dir: str, chief: bool, verbose: int) -> keras.Model:
    """Fits `plan` with `model.fit` under its strategy, logging and backing up into
    `run_dir` (every worker saves its backup, as JAX needs every process in a save; the
    chief's, in the run dir, is the one every worker resumes from)."""
    config, spec, start, strat = plan.config, plan.spec, plan.start, plan.strategy
    if config.deterministic:
        if not backend.is_jax():  # process-wide: TensorFlow has no public way back
            import tensorflow as tf

            tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(config.seed)  # before the input's random ops are made
    steps, spe = config.steps, config.steps_per_epoch
    size = spec.input_shape[0]
    preprocessing = records.preprocessing_for(spec)
    shard = strat.input_shard  # a process of a multi-process JAX run reads its own part
    train_ds = pipeline.train_dataset(plan.source, plan.train_split, config.batch_size,
                                      image_size=size, seed=config.seed,
                                      preprocessing=preprocessing,
                                      deterministic=config.deterministic, shard=shard)
    # Without a slice of train held out, each epoch end is scored on the dataset's own
    # held-out split, for test-error curves like the paper's; no decision is made from them.
    val_ds = None if not plan.held_out else pipeline.eval_dataset(
        plan.source, plan.held_out, config.batch_size, image_size=size,
        preprocessing=preprocessing, shard=shard)
    schedule = plan.schedule()
    with strat.scope():
        net = build_and_compile(plan.model, schedule, config, spec=spec)
        if start is not None:
            loaded, initialized = run_start.load_start(net, start)
            if verbose:
                print(f"keras-preact: weights {start.weights!r}: loaded {len(loaded)} layers"
                      + (f", initialized {', '.join(initialized)} ({spec.classes} classes, "
                         f"the weights had {start.classes})" if initialized else "")
                      + (f"; frozen: {config.freeze}" if config.freeze != "none" else ""),
                      flush=True)

    # Every worker resumes from the chief's backup; fit continues the epoch it was in.
    backup_dir = os.path.join(plan.output, rundir.BACKUP)
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
    if resumed and (config.deterministic or isinstance(train_ds, arrays.Batches)):
        # fit reads one stream of batches over all epochs; a rerun's starts again at its
        # first batch. Skipping those the run has trained on runs the input's shuffle and
        # augmentation (and their random ops) through them, so that step `resumed + 1`
        # trains on the batch it would have had uninterrupted (NumPy arrays' batches are
        # indexed: skipping costs nothing, so a seeded run never repeats its first ones).
        train_ds = train_ds.skip(resumed)
    guard = run_callbacks.TrainingGuard(steps)
    own_backup = os.path.join(run_dir, rundir.BACKUP)  # the chief's: backup_dir
    backup = run_callbacks.RunBackup(own_backup, every=config.backup_every,
                                     steps_per_epoch=spe, saved_step=resumed)
    callbacks = [guard, backup]
    if importlib.util.find_spec("tensorflow") is not None:  # Keras writes it with tf.summary
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(run_dir, rundir.LOGS)))
    if val_ds is not None and not plan.val_split:  # first: later callbacks read test_* for test
        callbacks.insert(0, run_callbacks.RenameLogs(rundir.TEST_COLUMNS))
    sessions = run_callbacks.SessionLog(run_dir, strat.describe(), backend.name())
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
        # The steps this process made are on record: the guard's count, as on JAX the
        # model's state is unreadable once a collective failed.
        sessions.record(guard.step)
        lost = distribute.lost_worker(error)
        if lost is None:
            raise
        raise WorkerLost(f"Lost {lost}, at step {guard.step}; {kept()}. Restart every worker "
                         "with the same command to resume.", guard.step) from None

    if guard.nan_step is not None:
        raise TrainingDiverged(
            f"Loss became NaN/inf at step {guard.nan_step}; training stopped and {kept()}. "
            f"Rerun with a lower --lr (or a longer --warmup-steps) to resume from it; "
            f"{rundir.CONFIG} records the change.", guard.nan_step,
        )
    # The chief writes model.keras atomically; other workers save into their temp dir.
    with atomic_path(os.path.join(run_dir, rundir.MODEL)) as tmp:
        save_plain(net, tmp)
    shutil.rmtree(own_backup, ignore_errors=True)
    return net


# The libraries whose versions config.json records, those installed (the backend's among
# them): read from the installed packages' metadata, so that none is imported for it.
RECORDED_PACKAGES = ("keras", "tensorflow", "tensorflow_datasets", "jax", "jaxlib")


def _versions() -> dict:
    import keras_preact

    versions = {"keras_preact": keras_preact.__version__}
    for package in RECORDED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package.replace("_", "-"))
    return {**versions, "python": platform.python_version()}


