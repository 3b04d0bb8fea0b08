"""`evaluate`: a trained model's accuracy on a dataset's held-out split, with the input
pipeline and geometry the trainer and the exports share."""

from __future__ import annotations

from keras_preact import labels
from keras_preact.api import ModelOrPath, load_for_inference, preprocessing_of
from keras_preact.arch.introspect import outputs_logits
from keras_preact.arch.network import family_of
from keras_preact.data import pipeline, sources
from keras_preact.training.config import check_positive


def evaluate(model_or_path: ModelOrPath, *, dataset: str | sources.Source | None = None,
             split: str | None = None, data_dir: str | None = None, batch_size: int = 500,
             download: bool = True) -> dict:
    """Accuracy, error (percent), mean cross-entropy and example count on a TFDS split or an
    image folder (`dataset`, as `train` takes it, or resolved: `sources.resolve`).

    `dataset` defaults to what a run dir (or its model.keras) trained on, with its data dir,
    and on a folder the images the run held out (`sources.eval_source`); else cifar10.
    `split` defaults to the dataset's labelled held-out split (`test` for CIFAR,
    `validation` for imagenet2012, whose `test` split has no labels; a folder's `all`).
    A run that recorded its class names (trained on a folder or another TFDS dataset) is
    evaluated only on a dataset with the same names in the same order.

    Uses the shared eval geometry (`preprocessing.resize_for_eval`) and normalization.

    Example:
    >>> evaluate("runs/preact-110", split="test")  # doctest: +SKIP
    {'accuracy': 0.9363, 'error': 6.37, 'loss': 0.29, 'examples': 10000, 'dataset': 'cifar10',
     'split': 'test'}
    """
    import keras

    dataset, data_dir, split = sources.eval_source(model_or_path, dataset, data_dir, split)
    source = sources.resolve(dataset, data_dir)  # once: a folder is listed here only
    dataset, info = source.name, source.info
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
        source, _ = sources.prepare(source, download)
        split = source.info.eval_split
    if split is None:
        raise ValueError(f"Dataset {dataset!r} has no test or validation split: pass --split.")
    examples = sources.check_split(source, split, source.data_dir, download)
    size = model.input_shape[1] if family == "imagenet" else None
    ds = pipeline.eval_dataset(source, split, batch_size, image_size=size,
                               preprocessing=preprocessing_of(model))
    # A twin on the same layers is compiled, so that the caller's model keeps its own.
    twin = keras.Model(model.inputs, model.outputs)
    twin.compile(loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=outputs_logits(model)), metrics=["accuracy"], jit_compile=False)
    result = twin.evaluate(ds, verbose=0, return_dict=True)
    return {"accuracy": result["accuracy"], "error": 100.0 * (1.0 - result["accuracy"]),
            "loss": result["loss"], "examples": examples, "dataset": dataset, "split": split}
