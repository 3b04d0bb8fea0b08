"""A training run resolved once (`make_plan`): `train`'s arguments and flags checked, and
every name in them turned into the object it names (the network's spec, the data source
with its classes and splits, the weights to start from, the form, the strategy), so that
the fit loop and what it calls take one frozen `TrainPlan` and resolve nothing again.

User errors are one-line exceptions raised here, before the run dir is written; all but
the data's (prepared, its splits, its size) come before any TensorFlow or JAX work. The
engine (Keras' backend, its devices: `backend.Replicas`) is decided here, once.
"""

from __future__ import annotations

import dataclasses
import os

from keras_preact import host, rundir
from keras_preact.arch.specs import ResNetSpec, resolve
from keras_preact.data import pipeline, sources
from keras_preact.paper import CIFAR_RECIPE, IMAGENET_LR_DROPS
from keras_preact.training import backend, distribute
from keras_preact.training import start as run_start
from keras_preact.training.config import TrainConfig, absolute_paths
from keras_preact.training.net import check_recompute
from keras_preact.training.resume import check_sessions, resolve_stages, resumable_config
from keras_preact.weights import records

# The paper warms up for 400 of its 64,000 CIFAR iterations; any other run length keeps that
# share (as the lr drops keep theirs), so a first 100-step try needs no extra flag.
CIFAR_WARMUP_SHARE = CIFAR_RECIPE.warmup_steps / CIFAR_RECIPE.steps


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainPlan:
    """What a training run does, resolved once (`make_plan`); a fit loop takes it whole.

    `config` has every field the run decides filled in (`overrides` with the dataset's
    class count, the form in `stages`, `seed`, `warmup_steps`, `val_examples`,
    `steps_per_epoch`): it is what config.json records.
    """

    model: str  # the registered name
    spec: ResNetSpec  # the network it trains (the config's overrides applied)
    config: TrainConfig
    source: sources.Source  # the data, with its class names and splits
    examples: int  # in `source.base`, validation included
    train_split: str
    val_split: str | None  # validation (carved from the base, or the dataset's own)
    held_out: str | None  # what each epoch end is scored on: val_split, else the test split
    start: run_start.Start | None  # the trained weights it starts from
    output: str  # the run directory
    strategy: backend.Replicas  # the devices it trains over (made before any TF/JAX work)

    @property
    def lr_drops(self) -> tuple[float, ...]:
        """Where the learning rate drops by 10, as shares of the run (the paper's, by family)."""
        return CIFAR_RECIPE.lr_drops if self.spec.family == "cifar" else IMAGENET_LR_DROPS

    def schedule(self):
        """The paper's learning-rate schedule for this run (`optim.paper_schedule`)."""
        from keras_preact.optim import paper_schedule

        config = self.config
        return paper_schedule(config.steps, config.lr, config.warmup_steps, config.warmup_lr,
                              boundaries=self.lr_drops)


def make_plan(model: str, config: TrainConfig | None = None, *, output: str,
              download: bool = True, connect_timeout: float | None = None,
              class_names=None, **fields) -> TrainPlan:
    """The plan of `train(model, config, output=..., **fields)` (its arguments, as `train`
    documents them): everything checked and resolved, in the order a user meets the errors
    (the recipe, the dataset, the network, the weights, the run dir, then the data itself).
    The strategy is made before the data is touched: MultiWorkerMirroredStrategy sets up
    collectives at TensorFlow start-up (on JAX: `backend.select`)."""

    config, source = _recipe(config, class_names, fields, output)
    spec, config = _network(model, config, source)
    start = None if config.weights is None else run_start.start_from(model, spec,
                                                                      config.weights)
    if os.path.exists(output) and not os.path.isdir(output):
        raise FileExistsError(f"`output` must be a run directory; {output!r} is a file. "
                              "Choose another --output.")
    config = dataclasses.replace(
        config, stages=_stages(config, spec, output),
        seed=0 if config.deterministic and config.seed is None else config.seed,
        warmup_steps=default_warmup_steps(config.steps, spec.family)
        if config.warmup_steps is None else config.warmup_steps)
    check_recompute(model, config.stages, config.recompute)
    if os.path.exists(os.path.join(output, rundir.MODEL)):
        raise FileExistsError(f"{output!r} already holds a finished run ({rundir.MODEL}). "
                              "Choose another --output.")
    check_sessions(output)

    strategy = backend.select(config.strategy, connect_timeout or distribute.CONNECT_TIMEOUT_S)
    if config.batch_size % strategy.num_replicas:
        raise ValueError(f"`batch_size` (global) must be divisible by the "
                         f"{strategy.num_replicas} replicas. "
                         f"Received: batch_size={config.batch_size}")
    if config.strategy != "tpu" and not backend.gpu_count():
        host.warn_slow_cpu_settings(config.mixed_precision)
    source, examples = _prepared(source, download)
    pipeline.check_arrays(source, records.preprocessing_for(spec), spec.input_shape[0])
    config, (train_split, val_split, held_out) = _splits(config, source, examples)
    return TrainPlan(model=model, spec=spec, config=config, source=source, examples=examples,
                     train_split=train_split, val_split=val_split, held_out=held_out,
                     start=start, output=output, strategy=strategy)


def default_warmup_steps(steps: int, family: str) -> int:
    """The paper's warm-up share of a CIFAR run (400 of 64,000 iterations); none on ImageNet.

    Example:
    >>> default_warmup_steps(64000, "cifar"), default_warmup_steps(100, "cifar")
    (400, 1)
    """
    return round(steps * CIFAR_WARMUP_SHARE) if family == "cifar" else 0


def _recipe(config: TrainConfig | None, class_names, fields: dict, output: str
            ) -> tuple[TrainConfig, sources.Source]:
    """The recipe (`config` with `fields` replaced, what it leaves None filled as the run in
    `output` had it or by default, its paths absolute) and its data source. `fields["dataset"]`
    may be a name, a resolved `sources.Source` (the command line's, resolved before TensorFlow
    started) or the caller's tf.data.Dataset."""
    data = fields.get("dataset")
    given = data is not None and not isinstance(data, str)  # not a name to resolve
    if given:
        fields = {**fields, "dataset": data.name if isinstance(data, sources.Source)
                  else sources.ARRAYS if isinstance(data, tuple) else sources.IN_MEMORY}
    config = dataclasses.replace(config or TrainConfig(), **fields).recipe(
        resumable_config(output) if os.path.isdir(output) else {})
    config = dataclasses.replace(config, **absolute_paths(dataclasses.asdict(config)))
    return config, sources.resolve(data if given else config.dataset, config.data_dir,
                                   class_names)


def _network(model: str, config: TrainConfig, source: sources.Source
             ) -> tuple[ResNetSpec, TrainConfig]:
    """The spec of `model` that trains on `source`, and `config` with the class count in its
    overrides: a net of the dataset's family, with the dataset's classes (set unless the
    overrides name them) and the input the pipeline feeds."""
    overrides, info = config.overrides, source.info
    spec = resolve(model, **overrides)
    if info.family is not None and spec.family != info.family:
        raise ValueError(f"Model {model!r} is a {spec.family} network; dataset "
                         f"{config.dataset!r} needs a {info.family} one. "
                         f"Received: model={model!r}, dataset={config.dataset!r}")
    if spec.classes != info.classes and "classes" not in overrides:
        overrides = {**overrides, "classes": info.classes}
        spec = dataclasses.replace(spec, classes=info.classes)
    if spec.classes != info.classes:
        raise ValueError(f"{config.dataset!r} has {info.classes} classes. "
                         f"Received: classes={spec.classes}")
    _check_input_size(spec)
    return spec, dataclasses.replace(config, overrides=overrides)


def _check_input_size(spec: ResNetSpec) -> None:
    """The trainer feeds CIFAR's 32x32 images as they are and crops ImageNet to a square;
    both are RGB."""
    height, width, channels = spec.input_shape
    if channels != 3:
        raise ValueError(f"The datasets' images are RGB: input_shape needs 3 channels. "
                         f"Received: input_shape={spec.input_shape}")
    if spec.family == "cifar" and (height, width) not in ((32, 32), (None, None)):
        raise ValueError(f"CIFAR images are 32x32: train with input_shape (32, 32, 3). "
                         f"Received: input_shape={spec.input_shape}")
    if spec.family == "imagenet" and (height is None or height != width):
        raise ValueError(f"ImageNet training crops squares: input_shape must be (side, side, "
                         f"3). Received: input_shape={spec.input_shape}")


def _stages(config: TrainConfig, spec: ResNetSpec, output: str) -> str:
    """The form to train in (`resolve_stages`); frozen layers need the plain layer graph (a
    scanned stage is one layer)."""
    if config.freeze != "none" and config.stages == "scan":
        raise ValueError(f"`freeze` needs the plain layer graph: use stages 'auto' or "
                         f"'layers'. Received: freeze={config.freeze!r}, stages='scan'")
    stages = "layers" if config.freeze != "none" and config.stages == "auto" else config.stages
    return resolve_stages(stages, spec, output)


def _prepared(source: sources.Source, download: bool) -> tuple[sources.Source, int]:
    """`source` with its training split there (`sources.prepare`), and the examples in it
    (the caller's images: counted)."""
    if source.kind == sources.ARRAYS_KIND:
        return source, len(source.images[1])
    if source.kind == sources.IN_MEMORY_KIND:
        return source, pipeline.count_examples(source.images)
    return sources.prepare(source, download)


def _splits(config: TrainConfig, source: sources.Source, examples: int
            ) -> tuple[TrainConfig, tuple[str, str | None, str | None]]:
    """`config` with `val_examples` and `steps_per_epoch` filled in, and the splits the run
    reads: `(train_split, val_split, held_out)`."""
    info = source.info
    if config.val_examples is None:
        config = dataclasses.replace(config, val_examples=pipeline.default_val_examples(
            info, examples))
    if not config.val_examples + config.batch_size <= examples:
        raise ValueError(f"{config.dataset!r} has {examples} training examples: `val_examples` "
                         f"+ `batch_size` must not exceed that. Received: "
                         f"val_examples={config.val_examples}, batch_size={config.batch_size}")
    train_split, val_split = pipeline.train_val_splits(config.val_examples, source.base)
    if not config.val_examples and info.val_split:  # the dataset's own validation split
        val_split = info.val_split
    # Without validation, each epoch end is scored on the dataset's held-out split (if any).
    held_out = val_split or (info.eval_split if source.base == "train" else None)
    if held_out and source.kind == sources.TFDS:  # a folder's is a slice of its checked base
        sources.check_split(source, held_out, source.data_dir)
    config = dataclasses.replace(config, steps_per_epoch=config.steps_per_epoch or max(1, (
        examples - config.val_examples) // config.batch_size))
    return config, (train_split, val_split, held_out)
