"""The recipe as one object: `TrainConfig` makes the train flags, config.json and the resume
check; the run directory's files (`keras_preact.rundir`) and the metrics CSV."""

import dataclasses
import os
import re
import typing

import pytest

from keras_preact import cli, rundir
from keras_preact.training import TrainConfig
from keras_preact.training import config as recipe

FIELDS = dataclasses.fields(TrainConfig)


def _parse_train(*flags):
    args = cli.build_parser().parse_args(["train", "preact-20", "--output", "run", *flags])
    values = {f.name: getattr(args, f.name) for f in FIELDS}
    return TrainConfig(**{**values, "overrides": recipe.parse_overrides(args.overrides)})


def _other_value(f):
    """A valid value of field `f` other than its default, and the flags that give it."""
    flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
    if f.default is False:
        return True, [flag]
    if f.name == "overrides":
        return {"depth": 8}, [flag, "depth=8"]
    hint = typing.get_type_hints(TrainConfig)[f.name]
    value = {str: "x", float: 0.5, int: 7}[next(
        t for t in typing.get_args(hint) or [hint] if t is not type(None))]
    if f.metadata["choices"]:
        value = f.metadata["choices"][-1]
    return value, [flag, str(value)]


@pytest.mark.parametrize("f", FIELDS, ids=[f.name for f in FIELDS])
def test_each_field_is_a_train_flag_with_its_default(f):
    assert _parse_train() == TrainConfig()
    value, flags = _other_value(f)
    # freeze keeps loaded weights: it goes with --weights
    base = {"weights": "cifar10"} if f.name == "freeze" else {}
    flags += ["--weights", "cifar10"] if base else []
    assert _parse_train(*flags) == dataclasses.replace(TrainConfig(), **base, **{f.name: value})


def test_defaults_are_the_papers_recipe():
    config = TrainConfig().recipe()
    assert (config.steps, config.batch_size, config.lr, config.momentum, config.weight_decay,
            config.warmup_lr, config.nesterov) == (64000, 128, 0.1, 0.9, 1e-4, 0.01, False)
    from keras_preact.arch import scan

    assert recipe.STAGES == ("auto", *scan.STAGES)  # named apart so that --help needs no Keras


def test_resume_keys_and_what_a_diverged_run_may_change():
    assert recipe.RESUME_KEYS == (
        "model", "overrides", "dataset", "weights", "freeze", "steps", "batch_size", "lr",
        "warmup_steps", "warmup_lr", "nesterov", "momentum", "weight_decay", "val_examples",
        "steps_per_epoch", "mixed_precision", "stages")
    assert recipe.DIVERGED_MAY_CHANGE == ("lr", "warmup_steps", "warmup_lr")


@pytest.mark.parametrize("fields, message", [
    ({"steps": 0}, "`steps` must be a positive integer. Received: steps=0"),
    ({"batch_size": True}, "`batch_size` must be a positive integer. Received: batch_size=True"),
    ({"steps_per_epoch": 2.5}, "Received: steps_per_epoch=2.5"),
    ({"backup_every": -1}, "`backup_every` must be a positive integer. Received: backup_every=-1"),
    ({"val_examples": -1},
     "`val_examples` must be None or an integer >= 0. Received: val_examples=-1"),
    ({"steps": 100, "warmup_steps": 100},
     "`warmup_steps` must be an integer in [0, steps=100). Received: warmup_steps=100"),
    ({"lr": float("nan")}, "Need finite lr > 0, warmup_lr > 0, weight_decay >= 0, 0 <= "
                           "momentum < 1. Received: lr=nan, warmup_lr=0.01, "
                           "weight_decay=0.0001, momentum=0.9"),
    ({"momentum": 1.0}, "momentum=1.0"),
    ({"strategy": "gpu"}, "Unknown strategy 'gpu'. Valid: ['auto', 'one-device', 'mirrored', "
                          "'multi-worker', 'tpu']."),
    ({"mixed_precision": "fp8"}, "Unknown mixed_precision 'fp8'. Valid: ['off', 'bfloat16', "
                                 "'float16']."),
    ({"freeze": "all"}, "Unknown freeze 'all'. Valid: ['none', 'bn', 'backbone']."),
    # Froze freshly initialized BatchNorm (mean 0, variance 1) without a word (#43).
    ({"freeze": "bn"}, "`freeze` keeps loaded weights fixed: pass the weights to start from "
                       "with it (--weights TAG|FILE|RUN_DIR), or freeze 'none'. Received: "
                       "freeze='bn', weights=None"),
    ({"freeze": "backbone"}, "Received: freeze='backbone', weights=None"),
    # Was accepted, then refused by keras.utils.set_random_seed after the run dir was made.
    ({"seed": -1}, "`seed` must be None or an integer in [0, 2**32). Received: seed=-1"),
    ({"seed": 2**32}, "Received: seed=4294967296"),
    # Were accepted: "no" switched Nesterov on; a string rate was a TypeError.
    ({"nesterov": "no"}, "`nesterov` must be True or False. Received: nesterov='no'"),
    ({"jit_compile": 1}, "`jit_compile` must be True or False. Received: jit_compile=1"),
    ({"lr": "0.1"}, "Received: lr='0.1', warmup_lr=0.01, weight_decay=0.0001, momentum=0.9"),
])
def test_a_bad_field_is_a_one_line_error(fields, message):
    with pytest.raises(ValueError) as error:
        TrainConfig(**fields)
    assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=re.escape(message)):  # so does replace
        dataclasses.replace(TrainConfig(), **fields)


def test_bad_flags_fail_before_tensorflow_starts(capsys):
    code = """
import sys
from keras_preact import cli
print(cli.main(["train", "preact-20", "--output", "/nonexistent/run", "--strategy", "gpu"]),
      "tensorflow" in sys.modules, "keras" in sys.modules)
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["2", "False", "False"]
    assert done.stderr == ("keras-preact train: error: Unknown strategy 'gpu'. Valid: ['auto', "
                           "'one-device', 'mirrored', 'multi-worker', 'tpu'].\n")


# config.json's entries, in order (the resume check and readers such as export rely on them).
CONFIG_KEYS = ["model", "overrides", "dataset", "data_dir", "weights", "freeze", "steps",
               "batch_size", "lr", "warmup_steps", "warmup_lr", "nesterov", "momentum",
               "weight_decay", "val_examples", "steps_per_epoch", "strategy", "mixed_precision",
               "jit_compile", "stages", "recompute", "backup_every", "seed", "deterministic",
               "family", "classes", "class_names", "train_split", "val_split", "replicas",
               "versions"]


def test_train_takes_a_config_or_its_fields_and_config_json_round_trips(
        cifar10_data_dir, tmp_path, monkeypatch):
    """Stops where fitting would start: what `train` resolved and wrote to config.json."""
    from keras_preact.training import trainer

    monkeypatch.setattr(trainer, "_fit", lambda plan, **where: plan.config)
    fields = dict(steps=90, batch_size=64, val_examples=500, lr=0.05, overrides={"depth": 8},
                  data_dir=cifar10_data_dir)
    by_config = trainer.train("preact-20", TrainConfig(**fields), output=str(tmp_path / "a"))
    by_keywords = trainer.train("preact-20", output=str(tmp_path / "b"), **fields)
    mixed = trainer.train("preact-20", TrainConfig(**{**fields, "lr": 0.2}), lr=0.05,
                          output=str(tmp_path / "c"))
    assert by_config == by_keywords == mixed
    # Resolved: the paper's warm-up share, examples // batch, scanned stages for preact.
    assert (by_config.warmup_steps, by_config.steps_per_epoch, by_config.stages) == (1, 773, "scan")
    saved = [rundir.read_config(tmp_path / d) for d in "abc"]
    assert list(saved[0]) == CONFIG_KEYS
    assert saved[0] == saved[1] == saved[2]
    assert saved[0]["model"] == "preact-20" and saved[0]["classes"] == 10
    assert TrainConfig(**{f.name: saved[0][f.name] for f in FIELDS}) == by_config


def test_a_resumed_run_must_keep_its_warmup_lr(tmp_path):
    """warmup_lr, which a diverged run may change, is part of the recipe a rerun keeps."""
    from keras_preact.training import resume

    before = {"model": "preact-20", **dataclasses.asdict(TrainConfig())}
    rundir.write_config(tmp_path, before)
    (tmp_path / rundir.BACKUP).mkdir()
    (tmp_path / rundir.BACKUP / rundir.BACKUP_FILE).write_bytes(b"")
    assert resume.resume_config(str(tmp_path), dict(before)) == before
    with pytest.raises(ValueError, match=r"other settings.*Received \(before -> now\): "
                                         r"warmup_lr: 0.01 -> 0.02$"):
        resume.resume_config(str(tmp_path), {**before, "warmup_lr": 0.02})
    rundir.write_config(tmp_path, {**before, "diverged_at_step": 7})
    assert resume.resume_config(str(tmp_path), {**before, "warmup_lr": 0.02})["changes"] == [
        {"at_step": 7, "warmup_lr": [0.01, 0.02]}]


@pytest.mark.parametrize("text, message", [
    ("{oops", r"run/config.json is not a keras-preact run config \(Expecting property name"),
    ("[1]", r"run/config.json is not a keras-preact run config \(\[1\]\)\.$"),
])
def test_read_config_names_a_bad_file(text, message, tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError):
        rundir.read_config(tmp_path / "run")
    (tmp_path / "run" / rundir.CONFIG).write_text(text)
    with pytest.raises(ValueError, match=message):
        rundir.read_config(tmp_path / "run")


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path):
    from keras_preact.files import atomic_path

    path = tmp_path / rundir.MODEL
    path.write_text("old")
    with pytest.raises(OSError, match="disk full"):
        with atomic_path(str(path)) as tmp:
            assert tmp.endswith(rundir.MODEL) and os.path.dirname(tmp) == str(tmp_path)
            open(tmp, "w").write("half")
            raise OSError("disk full")
    assert os.listdir(tmp_path) == [rundir.MODEL] and path.read_text() == "old"


def test_metrics_csv_appends_epochs_in_its_column_order(tmp_path):
    """Keras' CSVLogger with step and lr added: a rerun appends without a second header;
    without a held-out split the val and test columns are empty."""
    import keras
    import numpy as np

    from keras_preact.optim import paper_schedule
    from keras_preact.training.callbacks import MetricsCSV

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    schedule = paper_schedule(8, warmup_steps=0)
    model.compile(keras.optimizers.SGD(schedule), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    x, y = np.ones((8, 3), "float32"), np.zeros(8, "int32")
    path = str(tmp_path / rundir.METRICS)
    for epochs in (2, 4):  # a run, then its resumption
        model.fit(x, y, batch_size=4, epochs=epochs, initial_epoch=epochs - 2, verbose=0,
                  callbacks=[MetricsCSV(path, schedule)])
    lines = open(path).read().splitlines()
    assert lines[0] == ",".join(rundir.METRICS_COLUMNS)
    rows = [line.split(",") for line in lines[1:]]
    assert [r[:3] for r in rows] == [["0", "2", "0.1"], ["1", "4", "0.1"],
                                     ["2", "6", "0.01"], ["3", "8", "0.001"]]
    assert all(float(r[3]) > 0 and 0 <= float(r[4]) <= 1 and r[5:] == [""] * 4 for r in rows)


def test_the_seed_fixes_the_initial_weights():
    import numpy as np

    from keras_preact.optim import paper_schedule
    from keras_preact.training.net import build_and_compile

    def initial(seed):
        net = build_and_compile("preact-20", paper_schedule(10, warmup_steps=0),
                                overrides={"depth": 8}, seed=seed)
        return [np.asarray(w) for w in net.get_weights()]

    first = initial(0)
    for a, b in zip(first, initial(0)):
        np.testing.assert_array_equal(a, b)
    kernels = [i for i, w in enumerate(first) if w.ndim == 4]
    assert kernels and all(not np.array_equal(first[i], w) for i, w in enumerate(initial(1))
                           if i in kernels)


@pytest.mark.parametrize("precision, recompute_bn", [("off", True), ("bfloat16", False)])
def test_mixed_precision_keeps_bn_relu_outputs_for_the_backward_pass(precision, recompute_bn):
    """benchmarks/README.md: keeping them is faster in bfloat16 and only costs memory in
    float32, so the trainer recomputes them in float32 runs only."""
    from keras_preact.arch.scanned_units import scanned_layers
    from keras_preact.optim import paper_schedule
    from keras_preact.training.net import build_and_compile

    net = build_and_compile("preact-20", paper_schedule(10, warmup_steps=0),
                            overrides={"depth": 14}, mixed_precision=precision)
    layers = scanned_layers(net)
    assert layers and {layer.recompute_bn for layer in layers} == {recompute_bn}


@pytest.fixture
def images_in_cwd(tmp_path, monkeypatch):
    """A folder `images/` of two classes of three 8x8 images in the working directory, and
    `train` that plans and returns its config without fitting."""
    import numpy as np
    import PIL.Image

    from keras_preact.training import trainer

    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(3):
            PIL.Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(
                tmp_path / "images" / name / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer, "_fit", lambda plan, **where: plan.config)


def test_a_rerun_leaving_the_recipe_to_its_defaults_resumes_with_the_run_s_own(
        tmp_path, images_in_cwd):
    """steps, batch_size, lr and warm-up left unset take the resumed run's recorded values,
    not today's defaults: a fine-tune made when its default batch was 128 (now 32) resumed
    only with `--batch-size 128` (#43). Where there is nothing to resume, the defaults."""
    from keras_preact.training import trainer

    fixed = dict(dataset="images", val_examples=1, overrides={"depth": 8})
    trainer.train("preact-20", output="run", steps=3, batch_size=2, lr=0.05, **fixed)
    (tmp_path / "run" / rundir.BACKUP).mkdir()
    (tmp_path / "run" / rundir.BACKUP / rundir.BACKUP_FILE).write_bytes(b"")
    resumed = trainer.train("preact-20", output="run", **fixed)
    assert (resumed.steps, resumed.batch_size, resumed.lr) == (3, 2, 0.05)
    (tmp_path / "run" / rundir.BACKUP / rundir.BACKUP_FILE).unlink()  # nothing to resume
    with pytest.raises(ValueError, match=r"Received: val_examples=1, batch_size=128$"):
        trainer.train("preact-20", output="run", **fixed)


def test_one_folder_spelt_two_ways_is_one_run_and_resumes(tmp_path, images_in_cwd):
    """`--dataset images/`, `images` and its absolute path (and `--weights` likewise) name one
    folder: config.json records it absolute, and the rerun resumes instead of being refused
    as a run with other settings (#43)."""
    from keras_preact.training import resume, trainer

    fields = dict(steps=2, batch_size=2, val_examples=1, overrides={"depth": 8})
    config = trainer.train("preact-20", output="run", dataset="images/", **fields)
    assert config.dataset == rundir.read_config("run")["dataset"] == str(tmp_path / "images")
    (tmp_path / "run" / rundir.BACKUP).mkdir()
    (tmp_path / "run" / rundir.BACKUP / rundir.BACKUP_FILE).write_bytes(b"")
    for spelling in ("images", "./images/", str(tmp_path / "images") + "/"):
        trainer.train("preact-20", output="run", dataset=spelling, **fields)  # resumes
    # A run dir recorded before paths were absolute: its relative path, resolved here.
    saved = {**rundir.read_config("run"), "dataset": "images/"}
    rundir.write_config("run", saved)
    assert resume.resume_config("run", {**saved, "dataset": str(tmp_path / "images")})
    from keras_preact.training.config import absolute_paths

    assert absolute_paths({"weights": "run/", "dataset": "cifar10"}) == {
        "weights": str(tmp_path / "run"), "dataset": "cifar10"}  # a run dir; a TFDS name
    assert absolute_paths({"weights": "cifar10"}) == {"weights": "cifar10"}  # a tag
    (tmp_path / "other" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"other settings.*dataset: 'images/' -> '.*/other'"):
        resume.resume_config("run", {**saved, "dataset": str(tmp_path / "other")})
