"""An image folder as a dataset: one subfolder per class, as
`keras.utils.image_dataset_from_directory` reads it.

Classes are the sorted subfolder names (label i = the i-th), images the files with
`IMAGE_EXTENSIONS` in them and in their subfolders. What is not an image is skipped, and the
skipped entries are named in one warning (`scan`): hidden entries (".DS_Store",
".ipynb_checkpoints", at the top too: never a class), other files, broken links, and a
directory reached a second time (a link loop such as `cat/up -> ..`, or a link into another
class: each real directory is read once, so no image is counted twice). A file with an image
extension that cannot be read (permissions) or decoded is refused in one line naming it
(`scan`, `check_images`), before training starts. Images are decoded as
RGB (grayscale and RGBA converted), uint8, at their own size; the trainer resizes them to the
network's input (`keras_preact.data.pipeline`). Splits are slices of one fixed shuffle of the
files: `all`, `all[:-N]`, `all[-N:]` (the trainer holds out the last N for validation).

Example:
>>> import tempfile, numpy as np, PIL.Image
>>> root = tempfile.mkdtemp()
>>> for name in ("cat", "dog"):
...     os.makedirs(os.path.join(root, name))
...     PIL.Image.fromarray(np.zeros((8, 8, 3), "uint8")).save(os.path.join(root, name, "1.png"))
>>> folder = scan(root)
>>> folder.class_names, len(folder.files), count(folder, "all[-1:]")
(('cat', 'dog'), 2, 1)
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings

# What image_dataset_from_directory reads (lower case compared).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
# The fixed shuffle of the files that splits slice: the same validation images for every --seed.
SPLIT_SEED = 1337
SPLIT = re.compile(r"^all(?:\[(-?\d*):(-?\d*)\])?$")


@dataclasses.dataclass(frozen=True)
class ImageFolder:
    class_names: tuple[str, ...]
    files: tuple[str, ...]  # in the fixed split order (SPLIT_SEED)
    labels: tuple[int, ...]


def is_folder(dataset: str) -> bool:
    """A `--dataset` value that names a folder rather than a TFDS dataset (a paper dataset's
    name is that dataset, whatever folder of that name the working directory holds)."""
    from keras_preact.data.catalog import DATASETS

    return dataset not in DATASETS and (os.path.isdir(dataset) or os.sep in dataset
                                        or dataset.startswith("."))


def scan(root: str) -> ImageFolder:
    """The classes and image files of folder `root`; a one-line ValueError for a folder that
    cannot train a classifier (missing, empty, fewer than two classes, a class without
    images, an image file it may not read). Entries that are not images are skipped and
    named in one warning, once per process."""
    import numpy as np

    if not os.path.isdir(root):
        raise FileNotFoundError(f"No image folder at {root!r}: --dataset takes a TFDS name or "
                                "a folder with one subfolder of images per class.")
    skipped: list[str] = []  # "cat/.DS_Store (hidden)", ...
    names = []
    for name in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, name)):
            if name.startswith("."):
                skipped.append(f"{name} (hidden)")
            else:
                names.append(name)
    if len(names) < 2:
        raise ValueError(f"An image folder needs one subfolder per class, at least 2. "
                         f"Received: {root!r} with {len(names)} ({names})")
    # Each real directory is read once: the root and every class folder are the classes'.
    seen = {os.path.realpath(root)} | {os.path.realpath(os.path.join(root, n)) for n in names}
    files, labels = [], []
    for label, name in enumerate(names):
        found = _images(root, name, seen, skipped)
        if not found:
            raise ValueError(f"Class folder {os.path.join(root, name)!r} holds no images "
                             f"({', '.join(IMAGE_EXTENSIONS)}).")
        files += found
        labels += [label] * len(found)
    _say_skipped(root, skipped)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(files))
    return ImageFolder(tuple(names), tuple(files[i] for i in order),
                       tuple(labels[i] for i in order))


def _images(root: str, name: str, seen: set[str], skipped: list[str]) -> list[str]:
    """The image files of class folder `name`, sorted, each real file once; what is not one
    goes into `skipped`, and each directory read into `seen`."""
    found, real_files = [], set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
        for d in sorted(dirnames):  # pruned in place: os.walk does not enter them
            path = os.path.join(dirpath, d)
            reason = "hidden" if d.startswith(".") else (
                "a folder already read: a link loop or a link to another class"
                if os.path.realpath(path) in seen else None)
            if reason:
                dirnames.remove(d)
                skipped.append(f"{os.path.relpath(path, root)} ({reason})")
            else:
                seen.add(os.path.realpath(path))
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            reason = _not_an_image(path, f, real_files)
            if reason:
                skipped.append(f"{os.path.relpath(path, root)} ({reason})")
                continue
            if not os.access(path, os.R_OK):
                raise PermissionError(f"Cannot read image {path!r} (permission denied): make it "
                                      "readable, or move it out of the folder.")
            real_files.add(os.path.realpath(path))
            found.append(path)
    return sorted(found)


def _not_an_image(path: str, name: str, real_files: set[str]) -> str | None:
    """Why file `path` (`name`) is skipped, or None for an image to read."""
    if name.startswith("."):
        return "hidden"
    if not name.lower().endswith(IMAGE_EXTENSIONS):
        return f"not {', '.join(e[1:] for e in IMAGE_EXTENSIONS)}"
    if not os.path.exists(path):
        return "a broken link"
    if not os.path.isfile(path):
        return "not a regular file"
    if os.path.realpath(path) in real_files:
        return "a second link to an image of its class"
    return None


# What `_say_skipped` has said in this process, which may scan a folder more than once (a
# run lists it once, `sources.resolve`; an evaluate after it again).
_SAID: set[str] = set()
SKIPPED_NAMED = 5  # entries named in the warning; the rest are counted


def _say_skipped(root: str, skipped: list[str]) -> None:
    if not skipped:
        return
    more = len(skipped) - SKIPPED_NAMED
    entries = "1 entry" if len(skipped) == 1 else f"{len(skipped)} entries"
    message = (f"skipped {entries} of image folder {os.path.abspath(root)!r} that are not "
               f"images: {', '.join(skipped[:SKIPPED_NAMED])}"
               + (f" and {more} more" if more > 0 else ""))
    if message not in _SAID:
        _SAID.add(message)
        warnings.warn(message, stacklevel=3)


def select(split: str) -> slice:
    """The slice of the files (or elements) that `split` names: `all`, `all[:-N]`, ..."""
    match = SPLIT.match(split)
    if not match:
        raise ValueError(f"An image folder's splits are 'all' or slices of it, e.g. "
                         f"'all[:-100]', 'all[-100:]'. Received: split={split!r}")
    start, stop = (int(v) if v else None for v in match.groups())
    return slice(start, stop)


def count(folder: ImageFolder, split: str) -> int:
    """Images in `split` of `folder`."""
    return len(folder.files[select(split)])


def check_images(folder: ImageFolder, split: str = "all") -> None:
    """Decodes every image of `split` once: a file that is not an image, or is truncated, is
    a one-line ValueError naming it, before anything is written."""
    import tensorflow as tf

    for path in folder.files[select(split)]:
        try:
            tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        except tf.errors.OpError as error:  # not an image, truncated, gone, unreadable
            # TensorFlow's message: "{{function_node ...}} REASON [Op:DecodeImage] ..."
            reason = re.sub(r"\{\{.*?\}\}\s*", "", error.message).split(" [Op:")[0]
            reason = reason.splitlines()[0] if reason else type(error).__name__
            raise ValueError(f"Cannot read {path!r} as an image ({reason}); remove or "
                             "replace it.") from None


def load(folder: ImageFolder, split: str):
    """`(uint8 image [h, w, 3], int64 label)` pairs of `split`, decoded in order."""
    import tensorflow as tf

    part = select(split)
    ds = tf.data.Dataset.from_tensor_slices(
        (list(folder.files[part]), tf.constant(folder.labels[part], tf.int64)))

    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return tf.ensure_shape(image, (None, None, 3)), label

    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
