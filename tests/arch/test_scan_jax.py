"""Scanned stages on the JAX backend: the TensorFlow loop's weights and math.

The JAX side runs in a subprocess (`KERAS_BACKEND=jax`): `on_jax` calls a function of this
module there, which writes what it computed (or asserts) under a shared directory.
"""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_preact.api import build_network
from keras_preact.arch import scan
from tests.arch.test_scan import NETS, images, moving_statistics, plain_with_statistics

pytest.importorskip("jax")
ROOT = pathlib.Path(__file__).parents[2]
NAME, OVERRIDES = NETS["bottleneck"]  # preact-164 with 2, 1, 1 scanned units per stage


def on_jax(function: str, directory: pathlib.Path) -> None:
    """Runs `function(directory)` of this module in a JAX-backend subprocess (from the
    repository root, which `python -c` puts first on sys.path)."""
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    code = ("import keras, sys\n"
            "assert keras.backend.backend() == 'jax'\n"
            "from tests.arch import test_scan_jax\n"
            f"test_scan_jax.{function}(sys.argv[1])\n")
    done = subprocess.run([sys.executable, "-c", code, str(directory)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def outputs(model, x) -> np.ndarray:
    return keras.ops.convert_to_numpy(model(x, training=False))


def jax_loads_and_trains(directory: str) -> None:
    """JAX side of the file test: TF's plain and scanned files into the scanned model;
    then one training step, saved (the scanned layout) with its inference outputs."""
    d = pathlib.Path(directory)
    x = np.load(d / "images.npy")
    for form in ("plain", "scanned"):
        model = build_network(NAME, stages="scan", weights=str(d / f"tf_{form}.weights.h5"),
                              **OVERRIDES)
        np.save(d / f"jax_from_{form}.npy", outputs(model, x))
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    model.train_on_batch(x, np.arange(len(x)) % 10)
    model.save_weights(d / "jax.weights.h5")
    np.save(d / "jax_trained.npy", outputs(model, x))


def test_weights_files_go_both_ways_between_jax_and_tensorflow(tmp_path):
    plain = plain_with_statistics("bottleneck")
    fast = scan.to_scanned(plain)
    x = images(plain, n=4, seed=7)
    np.save(tmp_path / "images.npy", x)
    plain.save_weights(tmp_path / "tf_plain.weights.h5")
    fast.save_weights(tmp_path / "tf_scanned.weights.h5")
    on_jax("jax_loads_and_trains", tmp_path)
    expected = outputs(plain, x)
    for form in ("plain", "scanned"):
        np.testing.assert_allclose(np.load(tmp_path / f"jax_from_{form}.npy"), expected,
                                   atol=1e-5, err_msg=f"TF {form} file on JAX")
    trained = np.load(tmp_path / "jax_trained.npy")
    assert np.abs(trained - expected).max() > 1e-3  # the JAX step changed the weights
    for stages in ("layers", "scan"):
        model = build_network(NAME, stages=stages, weights=str(tmp_path / "jax.weights.h5"),
                              **OVERRIDES)
        np.testing.assert_allclose(outputs(model, x), trained, atol=1e-5, err_msg=stages)


def gradients(model, x, y) -> dict:
    """`{weight path: gradient}` of the cross-entropy of one training-mode batch (JAX)."""
    import jax

    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def loss(trainable):
        probs, _ = model.stateless_call(trainable, fixed, x, training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, probs))

    grads = jax.jit(jax.grad(loss))(trainable)
    return {v.path: np.asarray(g) for v, g in zip(model.trainable_variables, grads)}


def relative_error(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def jax_trains_like_plain(directory: str) -> None:
    """JAX side of the training test: the scanned form against the plain graph, both on JAX,
    from the same weights; the results go to `directory`/errors.json."""
    plain = plain_with_statistics("bottleneck")
    x, y = images(plain, n=8, seed=4), np.arange(8) % 10
    options = {"default": {}, "recompute": {"recompute": True},
               "kept_bn_relu": {"recompute_bn": False}}
    reference = gradients(plain, x, y)
    for w in plain.trainable_variables:  # the plain gradients in the scanned layout
        w.assign(reference[w.path])
    reference = {w.path: keras.ops.convert_to_numpy(w)
                 for w in scan.to_scanned(plain).trainable_variables}
    plain = plain_with_statistics("bottleneck")
    errors = {}
    for option, kwargs in options.items():
        grads = gradients(scan.to_scanned(plain, **kwargs), x, y)
        assert sorted(grads) == sorted(reference), option
        worst = max(reference, key=lambda k: relative_error(grads[k], reference[k]))
        errors[f"gradient {option}"] = [relative_error(grads[worst], reference[worst]), worst]
        errors[f"gradients {option}"] = relative_error(*(
            np.concatenate([g[k].ravel() for k in sorted(reference)]) for g in (grads, reference)))
    fast = scan.to_scanned(plain)
    losses = []
    for model in (plain, fast):
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        losses.append(float(model.train_on_batch(x, y)))
    errors["loss"] = abs(losses[1] - losses[0]) / abs(losses[0])
    before = moving_statistics(plain_with_statistics("bottleneck"))
    after, trained = moving_statistics(plain), scan.to_layered(fast)
    errors["statistics moved"] = float(np.abs(after - before).max())
    errors["statistics"] = float(np.abs(moving_statistics(trained) - after).max())
    errors["weights"] = max(float(np.abs(a - b).max())
                            for a, b in zip(trained.get_weights(), plain.get_weights()))
    (pathlib.Path(directory) / "errors.json").write_text(json.dumps(errors))


def test_one_training_step_on_jax_matches_the_plain_graph(tmp_path):
    on_jax("jax_trains_like_plain", tmp_path)
    errors = json.loads((tmp_path / "errors.json").read_text())
    # The same keras.ops on both sides, but XLA compiles the two programs differently, and
    # in float32 the BN backward of a few plain layers upstream of the loops amplifies that
    # round-off (seen: 1e-6 in every gradient from the head down into stage 2, up to 7e-4
    # from stage2_unit001_bn2 on; with a float64 policy, 1e-6 throughout: the loop's BN
    # stays float32). A wrong gradient term is off by O(1).
    for option in ("default", "recompute", "kept_bn_relu"):
        assert errors[f"gradient {option}"][0] < 5e-3, errors
        assert errors[f"gradients {option}"] < 1e-3, errors
    assert errors["loss"] < 1e-5, errors
    assert errors["statistics moved"] > 1e-2, errors
    assert errors["statistics"] < 1e-5, errors
    assert errors["weights"] < 1e-4, errors  # lr 0.1 times that round-off


POLICIES = ("mixed_bfloat16", "mixed_float16")


def variables_of(directory: str | pathlib.Path, backend: str) -> None:
    """Each policy's scanned variables (path, shape, dtype) and stage compute dtype, and on
    JAX the largest output difference to the plain graph there, into `directory`."""
    found = {}
    for policy in POLICIES:
        model = build_network(NAME, stages="scan", dtype=policy, **OVERRIDES)
        layer = model.get_layer("stage1_scan")
        found[policy] = {"variables": [[v.path, list(v.shape), v.dtype] for v in model.weights],
                         "compute": layer.compute_dtype}
        if backend == "jax":
            plain = build_network(NAME, dtype=policy, **OVERRIDES)
            scan.copy_weights(plain, model)
            x = images(model, n=4, seed=8)
            found[policy]["difference"] = float(np.abs(outputs(model, x) -
                                                       outputs(plain, x)).max())
    (pathlib.Path(directory) / f"{backend}.json").write_text(json.dumps(found))


def jax_variables(directory: str) -> None:
    variables_of(directory, "jax")


def test_mixed_precision_variables_are_tensorflows(tmp_path):
    on_jax("jax_variables", tmp_path)
    variables_of(tmp_path, "tensorflow")
    jax_found, tf_found = (json.loads((tmp_path / f"{b}.json").read_text())
                           for b in ("jax", "tensorflow"))
    for policy in POLICIES:
        assert jax_found[policy]["variables"] == tf_found[policy]["variables"], policy
        assert jax_found[policy]["compute"] == tf_found[policy]["compute"] == policy[6:]
        assert jax_found[policy]["difference"] < 1e-2, (policy, jax_found[policy])
    assert {dtype for _, _, dtype in tf_found["mixed_bfloat16"]["variables"]} == {"float32"}


def test_torch_is_refused_with_what_to_use():
    pytest.importorskip("torch")
    code = ("import keras_preact\n"
            "keras_preact.build('preact-164', stages='scan', depth=20)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "KERAS_BACKEND": "torch"}, cwd=ROOT, timeout=300)
    assert done.returncode != 0
    assert ("ValueError: Scanned stages run on the TensorFlow and JAX backends. Received: "
            "backend 'torch' (use stages='layers').") in done.stderr
