"""The training recipe as one object, `TrainConfig`: `train`'s keywords, the flags of
`keras-preact train` (`add_arguments`), RUN_DIR/config.json and the resume check come from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import os
import typing
from collections.abc import Sequence

from keras_preact.arch import specs
from keras_preact.data.catalog import PAPER_VAL_EXAMPLES
from keras_preact.data.sources import DATASET_HELP, FOLDER_VAL_SHARE, TFDS_VAL_SHARE
from keras_preact.paper import CIFAR_RECIPE, IMAGENET_LR_DROPS
from keras_preact.training.distribute import STRATEGIES

# The Keras dtype policy of each `mixed_precision` choice.
MIXED_PRECISION = {"off": None, "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
# "auto" (scan where it applies) and the forms a network is built in.
STAGES = ("auto", *specs.STAGES)
# Seeds keras.utils.set_random_seed (numpy's) accepts: [0, 2**32).
SEED_LIMIT = 2**32
# How a field takes part in resuming a run (`field(resume=...)`); fields without are free to
# change (e.g. the strategy: a run may move from one GPU to several machines).
KEEP = "keep"  # a rerun in the same RUN_DIR must keep it to resume
RETUNE = "retune"  # the same, except after a divergence (its error advises changing them)
# What `steps`, `batch_size`, `lr` and `warmup_steps` left None become
# (`TrainConfig.recipe`): the paper's recipe from random weights; from trained ones
# (`weights`), a short run at a tenth of the rate without warm-up, as fine-tuning goes (the
# Keras transfer-learning guide), in batches of `model.fit`'s default 32, so that a folder of
# 120 images (96 to train on once 20 % are held out) fits.
SCRATCH = {"steps": CIFAR_RECIPE.steps, "batch_size": CIFAR_RECIPE.batch_size,
           "lr": CIFAR_RECIPE.lr}
FINE_TUNE = {"steps": 1000, "batch_size": 32, "lr": 0.01, "warmup_steps": 0}
RECIPE_DEFAULTED = tuple(FINE_TUNE)  # the fields `TrainConfig.recipe` fills
# What `freeze` keeps as loaded: nothing; BatchNormalization layers (scale, offset and
# statistics: they run in inference mode); or every layer but the classifier.
FREEZE = ("none", "bn", "backbone")


def _percents(fractions: tuple[float, ...]) -> str:
    """`(0.5, 0.75)` as "50%% and 75%%" (escaped for argparse's help)."""
    return " and ".join(f"{100 * f:.3g}%%" for f in fractions)


def field(default, help: str, *, resume: str | None = None, choices: tuple | None = None,
          flag: str | None = None, metavar: str | None = None, path=None):
    """A `TrainConfig` field: its default (a callable: a default factory), --help text
    (`%(default)s` allowed), `resume` (KEEP, RETUNE or None), valid `choices`, `path` (for
    a field that may name a file or folder: a test of whether a value does, so that it is
    recorded and compared as one absolute spelling, `absolute_paths`) and, where the usual
    ones do not fit, its `flag` (else `--name-with-dashes`) and `metavar`."""
    metadata = {"help": help, "resume": resume, "choices": choices, "flag": flag,
                "metavar": metavar, "path": path}
    if callable(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The paper's training recipe (defaults: CIFAR, 64k iterations of batch 128), checked
    when made; `train(model, config)` runs it, `dataclasses.replace` varies it. Each field's
    meaning is its `help` (shown by `keras-preact train --help`).

    Example:
    >>> config = TrainConfig(steps=100, batch_size=32, overrides={"depth": 8})
    >>> config.recipe().lr, config.steps, config.stages
    (0.1, 100, 'auto')
    >>> dataclasses.replace(config, lr=0.05).lr
    0.05
    >>> TrainConfig(weights="cifar10").recipe().steps
    1000
    >>> TrainConfig(steps=0)
    Traceback (most recent call last):
    ...
    ValueError: `steps` must be a positive integer. Received: steps=0
    """

    overrides: dict = field(
        dict, 'build() override, JSON value, e.g. --override depth=8 --override '
        'unit=\\"original\\" (repeatable)', resume=KEEP, flag="--override", metavar="FIELD=VALUE")
    dataset: str = field("cifar10", f"{DATASET_HELP} (default %(default)s)", resume=KEEP,
                         metavar="NAME|FOLDER", path=lambda v: _is_folder(v))
    data_dir: str | None = field(None, "TFDS data_dir")
    weights: str | None = field(
        None, "start from trained weights: a published tag of MODEL (e.g. cifar10), a "
        ".weights.h5 file or a run dir; with another class count the classifier is new and "
        "everything below it loaded. Fine-tuning defaults: --steps "
        f"{FINE_TUNE['steps']}, --lr {FINE_TUNE['lr']}, --warmup-steps "
        f"{FINE_TUNE['warmup_steps']}", resume=KEEP, metavar="TAG|FILE|RUN_DIR",
        path=lambda v: os.path.isdir(v) or v.endswith(".weights.h5"))  # as start.start_from
    freeze: str = field("none", "keep loaded weights (--weights) fixed: bn = BatchNorm layers "
                        "(scale, offset and statistics), backbone = all but the classifier "
                        "(default %(default)s)", resume=KEEP, choices=FREEZE)
    steps: int | None = field(None, f"total iterations (default {SCRATCH['steps']}; "
                              f"{FINE_TUNE['steps']} with --weights)", resume=KEEP)
    batch_size: int | None = field(
        None, f"global batch, split across replicas; scale --lr with it (default "
        f"{SCRATCH['batch_size']}; {FINE_TUNE['batch_size']} with --weights)", resume=KEEP)
    lr: float | None = field(None, f"base learning rate (default {SCRATCH['lr']}; "
                             f"{FINE_TUNE['lr']} with --weights), divided by 10 at "
                             f"{_percents(CIFAR_RECIPE.lr_drops)} of --steps (ImageNet: "
                             f"{_percents(IMAGENET_LR_DROPS)})", resume=RETUNE)
    warmup_steps: int | None = field(
        None, "iterations at --warmup-lr first (default on CIFAR: the paper's "
        f"{CIFAR_RECIPE.warmup_steps} of {CIFAR_RECIPE.steps}, "
        "scaled with --steps, e.g. 1 for --steps 100; 0 on ImageNet and with --weights)",
        resume=RETUNE)
    warmup_lr: float = field(CIFAR_RECIPE.warmup_lr,
                             "learning rate of the warm-up (default %(default)s)", resume=RETUNE)
    nesterov: bool = field(False, "Nesterov momentum", resume=KEEP)
    momentum: float = field(CIFAR_RECIPE.momentum, "SGD momentum (default %(default)s)",
                            resume=KEEP)
    weight_decay: float = field(CIFAR_RECIPE.weight_decay, "gradient += wd * w, on every "
                                "parameter (default %(default)s)", resume=KEEP)
    val_examples: int | None = field(
        None, "validation images held out of train (0: none, then each epoch is scored on the "
        f"dataset's test split; default: {PAPER_VAL_EXAMPLES} on CIFAR and ImageNet, "
        f"{100 * FOLDER_VAL_SHARE:g}%% of a folder, a TFDS dataset's validation split, else "
        f"{100 * TFDS_VAL_SHARE:g}%% of its train)", resume=KEEP)
    steps_per_epoch: int | None = field(
        None, "iterations per epoch (default: training examples // batch size)", resume=KEEP)
    strategy: str = field(
        "auto", "devices and processes to train over: on TensorFlow the tf.distribute "
        "strategy (multi-worker: MultiWorkerMirroredStrategy from TF_CONFIG); on JAX "
        "keras.distribution (mirrored: DataParallel over the local devices; multi-worker: over "
        "every process' devices, from KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and "
        "_PROCESS_ID; tpu is TensorFlow's). auto: multi-worker when those name several "
        "workers, mirrored with several GPUs, else one-device (default %(default)s)",
        choices=STRATEGIES)
    mixed_precision: str = field("off", "compute dtype (default %(default)s)", resume=KEEP,
                                 choices=tuple(MIXED_PRECISION))
    jit_compile: bool = field(False, "compile steps with XLA")
    stages: str = field(
        "auto", "scan: run each stage's identical units as one loop (full pre-activation nets; "
        "a much faster start and less memory, benchmarks/README.md; on JAX's CPU, layers train "
        "faster); auto (default): scan where it applies, else layers (or the form of the run "
        "it resumes)", resume=KEEP,
        choices=STAGES)
    recompute: bool = field(False, "scanned stages: recompute whole units in the backward "
                            "pass (less memory, more time; benchmarks/README.md)")
    backup_every: int = field(1000, "back up every N iterations, and at each epoch end "
                              "(default %(default)s)")
    seed: int | None = field(None, "seed of the initial weights and the data order "
                             "(keras.utils.set_random_seed)")
    deterministic: bool = field(False, "the same weights on every run of the same command "
                                "(op determinism, a fixed input order; --seed defaults to 0; "
                                "slower, benchmarks/README.md)")

    def __post_init__(self):
        object.__setattr__(self, "overrides", dict(self.overrides or {}))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["choices"]:
                check_choice(f.name, value, f.metadata["choices"])
            if f.type == "bool" and not isinstance(value, bool):  # a truthy "no" is no switch
                raise ValueError(f"`{f.name}` must be True or False. Received: {f.name}={value!r}")
        check_positive(backup_every=self.backup_every)
        for name in ("steps", "batch_size", "steps_per_epoch"):
            if getattr(self, name) is not None:
                check_positive(**{name: getattr(self, name)})
        if self.val_examples is not None and not (isinstance(self.val_examples, int)
                                                  and self.val_examples >= 0):
            raise ValueError(f"`val_examples` must be None or an integer >= 0. "
                             f"Received: val_examples={self.val_examples!r}")
        if self.weights is not None and not (isinstance(self.weights, str) and self.weights):
            raise ValueError(f"`weights` must be None, a published tag, a .weights.h5 file or "
                             f"a run dir. Received: weights={self.weights!r}")
        if self.freeze != "none" and self.weights is None:  # fresh BN is mean 0, variance 1
            raise ValueError(f"`freeze` keeps loaded weights fixed: pass the weights to start "
                             f"from with it (--weights TAG|FILE|RUN_DIR), or freeze 'none'. "
                             f"Received: freeze={self.freeze!r}, weights=None")
        seed = self.seed  # checked here: keras.utils.set_random_seed refuses it only later
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)
                                     and 0 <= seed < SEED_LIMIT):
            raise ValueError(f"`seed` must be None or an integer in [0, 2**32). "
                             f"Received: seed={seed!r}")
        recipe = self.recipe()
        warmup, steps = self.warmup_steps, recipe.steps
        if warmup is not None and not (isinstance(warmup, int) and 0 <= warmup < steps):
            raise ValueError(f"`warmup_steps` must be an integer in [0, steps={steps}). "
                             f"Received: warmup_steps={warmup!r}")
        lr, warmup_lr = recipe.lr, self.warmup_lr
        decay, momentum = self.weight_decay, self.momentum
        rates = (lr, warmup_lr, decay, momentum)
        if not (all(isinstance(r, numbers.Real) and math.isfinite(r) for r in rates) and lr > 0
                and warmup_lr > 0 and decay >= 0 and 0 <= momentum < 1):
            raise ValueError(f"Need finite lr > 0, warmup_lr > 0, weight_decay >= 0, 0 <= "
                             f"momentum < 1. Received: lr={lr!r}, warmup_lr={warmup_lr!r}, "
                             f"weight_decay={decay!r}, momentum={momentum!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        """The config of flags parsed by a parser `add_arguments` made (checked as any)."""
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        return cls(**{**values, "overrides": parse_overrides(args.overrides)})

    def recipe(self, resumed: dict | None = None) -> TrainConfig:
        """This config with `steps`, `batch_size`, `lr` and `warmup_steps` left None set to
        what the run it resumes recorded (`resumed`, its config.json: so a rerun of the same
        command resumes even where a later version changed a default), else to the defaults
        of its start: `SCRATCH`, or `FINE_TUNE` with `weights` (a warm-up left None from
        scratch is the trainer's: it depends on the dataset)."""
        defaults = {**(FINE_TUNE if self.weights is not None else SCRATCH),
                    **{k: v for k, v in (resumed or {}).items()
                       if k in RECIPE_DEFAULTED and v is not None}}
        filled = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **filled) if filled else self


def _is_folder(dataset: str) -> bool:
    from keras_preact.data.folders import is_folder

    return is_folder(dataset)


def absolute_paths(values: dict) -> dict:
    """`values` (config.json entries) with each `path` field's value that names a file or
    folder made absolute and normalized: `data/good/`, `./data/good` and `/abs/data/good`
    are one folder, so a rerun spelling it otherwise resumes (`resume_config`)."""
    out = dict(values)
    for f in dataclasses.fields(TrainConfig):
        value = out.get(f.name)
        if f.metadata["path"] and isinstance(value, str) and f.metadata["path"](value):
            out[f.name] = os.path.abspath(value)
    return out


def _names(*kinds: str | None) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if f.metadata["resume"] in kinds)


# config.json entries a rerun in the same RUN_DIR must keep to resume; after a divergence,
# DIVERGED_MAY_CHANGE may change (recorded under "changes").
RESUME_KEYS = ("model", *_names(KEEP, RETUNE))
DIVERGED_MAY_CHANGE = _names(RETUNE)


def check_positive(**values) -> None:
    """Raises a one-line ValueError unless every value is an int >= 1.

    Example:
    >>> check_positive(steps=0)
    Traceback (most recent call last):
    ...
    ValueError: `steps` must be a positive integer. Received: steps=0
    """
    for name, value in values.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def check_choice(name: str, value, choices) -> None:
    """Raises a one-line ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}. Valid: {list(choices)}.")


def add_arguments(parser: argparse.ArgumentParser, names: Sequence[str] | None = None,
                  **defaults) -> None:
    """Adds a flag per `TrainConfig` field (or per field in `names`) to `parser`: `--lr` for
    `lr`, with the field's help, default (or `defaults[name]`) and choices (shown; checked
    by `TrainConfig`, one-line errors); booleans are switches; `overrides` is a repeatable
    `--override FIELD=VALUE` (a list of strings, for `parse_overrides`).

    Example:
    >>> parser = argparse.ArgumentParser()
    >>> add_arguments(parser, ["batch_size", "nesterov"], batch_size=64)
    >>> parser.parse_args(["--nesterov"])
    Namespace(batch_size=64, nesterov=True)
    """
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if names is not None and f.name not in names:
            continue
        kind = next(t for t in typing.get_args(hints[f.name]) or [hints[f.name]]
                    if t is not type(None))
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        options = {"dest": f.name, "help": f.metadata["help"]}
        if kind is bool:
            parser.add_argument(flag, action="store_true", **options)
            continue
        choices = f.metadata["choices"]
        options["metavar"] = f.metadata["metavar"] or (choices and "{" + ",".join(choices) + "}")
        if kind is dict:
            parser.add_argument(flag, action="append", default=[], **options)
        else:
            parser.add_argument(flag, type=kind, default=defaults.get(f.name, f.default),
                                **options)

def parse_overrides(items: list[str]) -> dict:
    """`["depth=8", "unit=original"]` -> `{"depth": 8, "unit": "original"}` (JSON values,
    bare strings allowed; lists become tuples, as spec fields expect).

    Example:
    >>> parse_overrides(["depth=8", "unit=original", "units=[3,3,3]"])
    {'depth': 8, 'unit': 'original', 'units': (3, 3, 3)}
    """
    overrides = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--override expects FIELD=VALUE. Received: {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides[name] = tuple(value) if isinstance(value, list) else value
    return overrides
