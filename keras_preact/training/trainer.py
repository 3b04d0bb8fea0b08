"""`train` and `evaluate`: the paper's recipe (`TrainConfig`) on `model.fit`, resumable,
through tf.distribute, into a run directory (`keras_preact.rundir`).

`model.keras` is written only when training finished: the trained network as plain Keras
layers, which `keras.saving.load_model` loads without keras_preact (see `shareable`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Sequence

from keras_preact import host, labels, rundir
from keras_preact.files import atomic_path
from keras_preact.introspect import family_of, outputs_logits, preprocessing_of
from keras_preact.training import callbacks as run_callbacks
from keras_preact.training import data, distribute
from keras_preact.training.config import (
    DIVERGED_MAY_CHANGE,
    FREEZE,
    MIXED_PRECISION,
    RESUME_KEYS,
    STAGES,
    TrainConfig,
    check_choice,
    check_positive,
)
from keras_preact.training.optimizer import SGDWithL2
from keras_preact.training.schedule import paper_schedule

# The paper warms up for 400 of its 64,000 CIFAR iterations; any other run length keeps that
# share (as the lr drops keep theirs), so a first 100-step try needs no extra flag.
CIFAR_WARMUP_SHARE = 400 / 64000
# config.json's "dataset" for images given as a tf.data.Dataset (`train(dataset=...)`).
IN_MEMORY = "tf.data.Dataset"


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
):
    """Trains registered network `model` with the recipe `config` (a `TrainConfig`, its
    fields given as keywords, or both: the keywords replace fields of `config`) into run
    directory `output`; returns the trained model.

    SGD (momentum 0.9, optional Nesterov), weight decay `gradient += weight_decay * w` on all
    parameters, lr `lr` divided by 10 at 50 % and 75 % of `steps` (ImageNet: epochs 30 and 60
    of 90), `warmup_steps` at `warmup_lr` first (default on CIFAR: the paper's 400 of 64,000
    iterations, scaled with `steps`; 0 on ImageNet); `TrainConfig` documents every field.
    With `download`, TFDS downloads and prepares CIFAR into `data_dir` if it is not there yet.
    Rerunning the same call after an interruption resumes from `output/backup`.
    `verbose`: 0 silent, 1 a live progress bar over all `steps`, 2 one line per epoch.
    Multi-worker runs wait `connect_timeout` seconds at most for the other workers
    (default `distribute.CONNECT_TIMEOUT_S`, 5 minutes).
    `dataset` may also be an image folder, any TFDS image-classification dataset, or a
    `tf.data.Dataset` of unbatched `(uint8 image [h, w, 1|3|4], int label)` pairs with their
    `class_names` (one pass; `val_examples` are held out of its end). `weights` starts from
    trained weights (a published tag, a `.weights.h5` file or a run dir; another class count
    gets a new classifier) with fine-tuning defaults (`config.FINE_TUNE`); `freeze` keeps
    BatchNorm or the whole backbone fixed; `deterministic` gives the same weights every time.
    `stages="auto"` trains full pre-activation nets with scanned stages (`keras_preact.scan`:
    same math, a much faster start and less memory) and other designs as plain layers;
    `model.keras` is always the plain layer graph. Returns the trained, compiled model in
    the form it trained in.

    Example (a few steps of a tiny net; the paper's run is `train("preact-110", output=...)`):
    >>> m = train("preact-20", output="/tmp/run", data_dir="../shared/tensorflow_datasets",
    ...           steps=20, batch_size=32, overrides={"depth": 8})  # doctest: +SKIP
    >>> int(m.optimizer.iterations)  # doctest: +SKIP
    20
    """
    import keras_preact
    from keras_preact import pretrained

    # --- Everything checkable without TensorFlow, before any work. ---
    images = fields.get("dataset")
    if isinstance(images, str):
        images = None
    elif images is not None:  # the caller's tf.data.Dataset
        fields["dataset"] = IN_MEMORY
    config = dataclasses.replace(config or TrainConfig(), **fields).recipe()
    info = _dataset_info(config, images, class_names)
    overrides = config.overrides
    spec = keras_preact.resolve(model, **overrides)
    if info.family is not None and spec.family != info.family:
        raise ValueError(f"Model {model!r} is a {spec.family} network; dataset "
                         f"{config.dataset!r} needs a {info.family} one. "
                         f"Received: model={model!r}, dataset={config.dataset!r}")
    if spec.classes != info.classes and "classes" not in overrides:
        overrides = {**overrides, "classes": info.classes}
        spec = keras_preact.resolve(model, **overrides)
    if spec.classes != info.classes:
        raise ValueError(f"{config.dataset!r} has {info.classes} classes. "
                         f"Received: classes={spec.classes}")
    _check_input_size(spec, spec.family)
    start = None if config.weights is None else pretrained.start_from(model, spec,
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
    _check_recompute(model, config.stages, config.recompute)
    if os.path.exists(os.path.join(output, rundir.MODEL)):
        raise FileExistsError(f"{output!r} already holds a finished run ({rundir.MODEL}). "
                              "Choose another --output.")

    # MWMS sets up collectives at TensorFlow start-up: create the strategy first.
    strat = distribute.select_strategy(config.strategy,
                                       connect_timeout or distribute.CONNECT_TIMEOUT_S)
    chief = distribute.is_chief(strat)
    if config.batch_size % strat.num_replicas_in_sync:
        raise ValueError(f"`batch_size` (global) must be divisible by the "
                         f"{strat.num_replicas_in_sync} replicas. "
                         f"Received: batch_size={config.batch_size}")
    if config.strategy != "tpu" and not distribute.gpu_count():
        _warn_slow_cpu_settings(config.mixed_precision)
    source = images if images is not None else config.dataset
    base = data.train_base(source)
    if images is not None:
        examples = data.count_examples(images)
    else:
        examples = data.check_split(config.dataset, base, config.data_dir, download)
        info = _dataset_info(config, images, class_names)  # a TFDS dataset's splits, prepared
    if config.val_examples is None:
        config = dataclasses.replace(config, val_examples=data.default_val_examples(
            info, examples))
    if not config.val_examples + config.batch_size <= examples:
        raise ValueError(f"{config.dataset!r} has {examples} training examples: `val_examples` "
                         f"+ `batch_size` must not exceed that. Received: "
                         f"val_examples={config.val_examples}, batch_size={config.batch_size}")
    train_split, val_split = data.train_val_splits(config.val_examples, base)
    if not config.val_examples and info.val_split:  # the dataset's own validation split
        val_split = info.val_split
    # Without validation, each epoch end is scored on the dataset's held-out split (if any).
    held_out = val_split or (info.eval_split if base == "train" else None)
    if held_out and images is None:
        data.check_split(config.dataset, held_out, config.data_dir)
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
        saved = _resume_config(output, saved)
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


def _warn_slow_cpu_settings(mixed_precision: str) -> None:
    """One warning for each setting that makes a CPU-only run far slower than it need be
    (figures in benchmarks/README.md, "Precision" and "oneDNN on AVX2-only CPUs")."""
    if host.onednn_off():
        warnings.warn(f"TensorFlow runs without its oneDNN kernels on this CPU, several times "
                      f"slower: set {host.ONEDNN}=1 before TensorFlow is imported (the "
                      f"keras-preact CLI does).", stacklevel=3)
    if mixed_precision == "float16":
        warnings.warn("float16 has no fast kernels on CPUs and runs far slower than float32: "
                      "use --mixed-precision bfloat16 (CPUs with AMX or AVX512-BF16) or off.",
                      stacklevel=3)
    if mixed_precision == "bfloat16" and host.cpu_has_bfloat16() is False:
        warnings.warn("this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), so bfloat16 "
                      "runs far slower than float32 here: use --mixed-precision off.",
                      stacklevel=3)


def default_warmup_steps(steps: int, family: str) -> int:
    """The paper's warm-up share of a CIFAR run (400 of 64,000 iterations); none on ImageNet.

    Example:
    >>> default_warmup_steps(64000, "cifar"), default_warmup_steps(100, "cifar")
    (400, 1)
    """
    return round(steps * CIFAR_WARMUP_SHARE) if family == "cifar" else 0


def build_and_compile(model: str, schedule, config: TrainConfig | None = None, *,
                      steps_per_execution: int = 1, **fields):
    """The network `train` fits, compiled as `train` compiles it (call in a strategy scope):
    `config` (a `TrainConfig`, or its fields as keywords) gives the overrides, the form
    (`stages`, `recompute`), the optimizer's settings, `mixed_precision`, `jit_compile`, and
    `seed`, which (when set) fixes the initial weights (`keras.utils.set_random_seed`).

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

    config = dataclasses.replace(config or TrainConfig(), **fields)
    stages = resolve_stages(config.stages, keras_preact.resolve(model, **config.overrides))
    _check_recompute(model, stages, config.recompute)
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    previous_policy = keras.config.dtype_policy()
    if MIXED_PRECISION[config.mixed_precision]:
        keras.config.set_dtype_policy(MIXED_PRECISION[config.mixed_precision])
    try:
        net = keras_preact.build(model, stages=stages, **config.overrides)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    # In mixed precision, keeping each BN + ReLU output for the backward pass is faster than
    # recomputing it, in memory that the lower precision saved; in float32 it would cost
    # memory for no measurable speed (benchmarks/README.md, "Precision").
    scan.set_options(net, recompute=config.recompute,
                     recompute_bn=not MIXED_PRECISION[config.mixed_precision])
    freeze(net, config.freeze)
    net.compile(
        optimizer=SGDWithL2(schedule, momentum=config.momentum, nesterov=config.nesterov,
                            l2=config.weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=outputs_logits(net)),
        metrics=["accuracy"],
        jit_compile=config.jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return net


def _fit(spec, model_name, config, strat, run_dir, output, chief, source, train_split,
         val_split, held_out, start, verbose):
    import keras
    import tensorflow as tf

    from keras_preact import pretrained

    if config.deterministic:  # process-wide: TensorFlow has no public way back
        tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(config.seed)  # before the input's random ops are made
    steps, spe = config.steps, config.steps_per_epoch
    size = spec.input_shape[0]
    preprocessing = pretrained.preprocessing_for(spec)
    train_ds = data.train_dataset(source, train_split, config.batch_size, config.data_dir,
                                  image_size=size, seed=config.seed, preprocessing=preprocessing,
                                  deterministic=config.deterministic)
    # Without a slice of train held out, each epoch end is scored on the dataset's own
    # held-out split, for test-error curves like the paper's; no decision is made from them.
    val_ds = None if not held_out else data.eval_dataset(
        source, held_out, config.batch_size, config.data_dir, image_size=size,
        cache=spec.family == "cifar", preprocessing=preprocessing)
    schedule = paper_schedule(
        steps, config.lr, config.warmup_steps, config.warmup_lr,
        boundaries=(0.5, 0.75) if spec.family == "cifar" else (1 / 3, 2 / 3),
    )
    with strat.scope():
        net = build_and_compile(model_name, schedule, config)
        if start is not None:
            loaded, initialized = pretrained.load_start(net, spec, start)
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
        print(f"keras-preact: resuming from step {resumed} of {steps} (backup {backup_dir})",
              flush=True)
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
        shareable(net).save(tmp)
    if chief:
        shutil.rmtree(backup_dir, ignore_errors=True)
    return net


def freeze(model, what: str) -> None:
    """Keeps layers of `model` fixed (`TrainConfig.freeze`): "bn", its BatchNormalization
    layers (Keras then runs them in inference mode: their statistics stay too); "backbone",
    every layer but the classifier; "none", nothing. Plain layer graphs only (`_stages`)."""
    import keras

    from keras_preact.builder import CLASSIFIER

    check_choice("freeze", what, FREEZE)
    for layer in model.layers:
        if what == "backbone" and layer.name != CLASSIFIER or (
                what == "bn" and isinstance(layer, keras.layers.BatchNormalization)):
            layer.trainable = False


def _stages(config: TrainConfig, spec, output: str) -> str:
    """The form to train in (`resolve_stages`); frozen layers need the plain layer graph (a
    scanned stage is one layer)."""
    if config.freeze != "none" and config.stages == "scan":
        raise ValueError(f"`freeze` needs the plain layer graph: use stages 'auto' or "
                         f"'layers'. Received: freeze={config.freeze!r}, stages='scan'")
    stages = "layers" if config.freeze != "none" and config.stages == "auto" else config.stages
    return resolve_stages(stages, spec, output)


def _dataset_info(config: TrainConfig, images, class_names) -> data.DatasetInfo:
    """`config.dataset`'s `data.DatasetInfo`, or one for the caller's tf.data.Dataset
    `images` with `class_names`, which go only with such images."""
    if images is None:
        if class_names is not None:
            raise ValueError(f"`class_names` go with a tf.data.Dataset: {config.dataset!r} "
                             "names its own classes.")
        return data.dataset_info(config.dataset, config.data_dir)
    if class_names is None:
        raise ValueError("A tf.data.Dataset of (image, label) needs `class_names` (one per "
                         "label, in label order).")
    names = labels.check_names(class_names, len(labels.as_list(class_names)))
    return data.DatasetInfo(None, len(names), None, names)


def _machine(strat) -> str:
    """The host line of a session record, with the strategy's replicas and workers."""
    gpus = distribute.gpu_count()
    workers = distribute.cluster_workers()
    return (f"{host.describe()}{f', {gpus} GPU' if gpus else ''}; {type(strat).__name__}, "
            f"replicas: {strat.num_replicas_in_sync}{f', workers: {workers}' if workers else ''}")


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


def _check_recompute(model: str, stages: str, recompute: bool) -> None:
    if recompute and stages != "scan":
        raise ValueError(f"`recompute` needs stages='scan' (full pre-activation nets). "
                         f"Received: model={model!r}, stages={stages!r}, recompute=True")


def _saved_config(output: str) -> dict:
    """The config.json of an earlier run in `output`, or {}."""
    if not os.path.exists(os.path.join(output, rundir.CONFIG)):
        return {}
    try:
        return rundir.read_config(output)
    except ValueError as error:
        raise ValueError(f"{error} Move it away to start over, or choose another --output.") \
            from None


def resolve_stages(stages: str, spec, output: str | None = None) -> str:
    """The form `train` builds: `"auto"` is the form of an earlier run in `output` (so it
    resumes), else "scan" for the nets it runs (a much faster start and less memory;
    benchmarks/README.md), else "layers"."""
    from keras_preact import scan

    check_choice("stages", stages, STAGES)
    if stages == "auto":
        return (output and _saved_config(output).get("stages")) or (
            "scan" if scan.scannable(spec) else "layers")
    if stages == "scan":
        scan.check_scannable(spec)
    return stages


def _resume_config(output: str, config: dict) -> dict:
    """The config a run in `output` continues with: `config`, checked against the run it
    resumes. Only a run with a backup has something to resume (a start that failed before
    its first backup is simply replaced); it resumes with the same recipe (`RESUME_KEYS`),
    except that a diverged run may change `DIVERGED_MAY_CHANGE`, recorded under "changes"."""
    before = _saved_config(output)
    if not before or not os.path.exists(os.path.join(output, rundir.BACKUP,
                                                     rundir.BACKUP_FILE)):
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
    import keras
    import tensorflow as tf
    import tensorflow_datasets as tfds

    import keras_preact

    return {"keras_preact": keras_preact.__version__, "keras": keras.__version__,
            "tensorflow": tf.__version__, "tensorflow_datasets": tfds.__version__,
            "python": platform.python_version()}


def evaluate(model_or_path, *, dataset: str = "cifar10", split: str | None = None,
             data_dir: str | None = None, batch_size: int = 500, download: bool = True) -> dict:
    """Accuracy, error (percent), mean cross-entropy and example count on a TFDS split or an
    image folder (`dataset`, as `train` takes it).

    `split` defaults to the dataset's labelled held-out split (`test` for CIFAR,
    `validation` for imagenet2012, whose `test` split has no labels; a folder's `all`).
    A run that recorded its class names (trained on a folder or another TFDS dataset) is
    evaluated only on a dataset with the same names in the same order.

    Uses the shared eval geometry (`preprocessing.resize_for_eval`) and normalization.

    Example:
    >>> evaluate("runs/preact-110", split="test")  # doctest: +SKIP
    {'accuracy': 0.9363, 'error': 6.37, 'loss': 0.29, 'examples': 10000, 'split': 'test'}
    """
    import keras

    from keras_preact.api import load_for_inference

    info = data.dataset_info(dataset, data_dir)
    check_positive(batch_size=batch_size)
    # A wrong path or a model that does not fit fails before the data is touched (downloaded).
    model = load_for_inference(model_or_path)
    family = family_of(model)
    if info.family not in (None, family) or model.output_shape[-1] != info.classes:
        raise ValueError(f"Dataset {dataset!r} needs a {info.family or 'cifar or imagenet'} "
                         f"model with {info.classes} outputs. Received: a {family} model with "
                         f"{model.output_shape[-1]} outputs.")
    trained_on = labels.recorded_names(model_or_path)
    if trained_on is not None and trained_on != info.class_names:
        raise ValueError(f"The model was trained on classes {list(trained_on)}; dataset "
                         f"{dataset!r} has {list(info.class_names)} (same names, same order "
                         "needed).")
    split = info.eval_split if split is None else split  # '' is a bad split, not the default
    if split is None:  # a TFDS dataset's splits are known once it is prepared
        data.check_split(dataset, data.train_base(dataset), data_dir, download)
        split = data.dataset_info(dataset, data_dir).eval_split
    if split is None:
        raise ValueError(f"Dataset {dataset!r} has no test or validation split: pass --split.")
    examples = data.check_split(dataset, split, data_dir, download)
    size = model.input_shape[1] if family == "imagenet" else None
    ds = data.eval_dataset(dataset, split, batch_size, data_dir, image_size=size,
                           preprocessing=preprocessing_of(model))
    # A twin on the same layers is compiled, so that the caller's model keeps its own.
    twin = keras.Model(model.inputs, model.outputs)
    twin.compile(loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=outputs_logits(model)), metrics=["accuracy"], jit_compile=False)
    result = twin.evaluate(ds, verbose=0, return_dict=True)
    return {"accuracy": result["accuracy"], "error": 100.0 * (1.0 - result["accuracy"]),
            "loss": result["loss"], "examples": examples, "split": split}
