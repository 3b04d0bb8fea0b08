"""keras-preact: the networks of *Identity Mappings in Deep Residual Networks* in Keras 3."""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
VERSION = re.search(
    r'__version__ = "([^"]+)"', (HERE / "keras_preact" / "__init__.py").read_text()
).group(1)

setup(
    name="keras-preact",
    version=VERSION,
    description=(
        "Pre-activation (and original) ResNets of He et al., ECCV 2016, for Keras 3: "
        "builders, a tf.distribute trainer, and TF Serving export."
    ),
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # released/ holds data only; naming it a package keeps setuptools from warning that an
    # importable directory is left out.
    packages=find_packages(include=["keras_preact", "keras_preact.*"])
    + ["keras_preact.weights.released"],
    include_package_data=True,
    # ImageNet class names (keras_preact.labels.IMAGENET_FILE); published weights small enough
    # to ship (keras_preact.weights.records.PACKAGE_DIR).
    package_data={"keras_preact": ["imagenet_classes.txt"],
                  "keras_preact.weights.released": ["*.weights.h5"]},
    install_requires=[
        # The full package, not tensorflow-cpu: tensorflow-serving-api requires it.
        "tensorflow>=2.20",
        "keras>=3.10",
        "tensorflow-datasets>=4.9",
        # tensorflow-datasets 4.9.x imports it without declaring it.
        "importlib_resources",
        # PredictionLog protos for the TF Serving warm-up file written at export.
        "tensorflow-serving-api>=2.20",
        # Training curves in the paper's style (`keras-preact plot`, notebooks).
        "matplotlib>=3.7",
        # TensorBoard logs of `keras-preact train`; TF 2.21 no longer installs it.
        "tensorboard>=2.20",
        # Reads timm's .safetensors checkpoints into numpy for the ImageNet tags
        # (keras_preact.weights.timm): a small wheel without dependencies, so no PyTorch at run
        # time.
        "safetensors>=0.4",
    ],
    extras_require={
        # nbclient/nbformat/ipykernel execute the notebooks inside the test suite; ruff is the
        # linter CI runs first (rules in pyproject.toml); wheel lets a venv's own setuptools
        # (65.x on Python 3.11) build the wheel tests/test_released.py inspects, offline;
        # pytest-xdist (pytest's own plugin) runs two test files at once: much of the suite is
        # one Python thread (building, tracing, subprocesses starting TensorFlow), so two
        # workers keep CI's two cores busy (README, "Tests").
        "test": ["pytest>=7", "pytest-xdist>=3", "nbclient>=0.9", "nbformat>=5.9",
                 "ipykernel>=6", "ruff>=0.6", "wheel>=0.38"],
        # The README's notebook commands: `jupyter lab` (jupyterlab) and `jupyter nbconvert`
        # (nbconvert), with the "python3" kernel (ipykernel). The test extra runs the notebooks
        # without them (nbclient).
        "notebooks": ["jupyterlab>=4", "nbconvert>=7", "ipykernel>=6"],
        # tests/weights/test_timm.py: timm's own ResNetV2 modules (random weights) are what the
        # converted models are checked against; timm >= 1.0.12 has resnetv2_18/34 and their
        # ImageNet tags. Pin the CPU build of torch in the same install (as the README's test
        # command and .ci/run do), or use `--index-url https://download.pytorch.org/whl/cpu`:
        # left to pip, timm's dependency resolves to a multi-GB CUDA build. keras_preact never
        # imports it.
        "convert": ["timm>=1.0.12", "torch>=2.4"],
        # tests/arch/test_registry.py builds the networks on Keras' JAX backend too and compares the
        # outputs with TensorFlow's (the CLI stays on TensorFlow). CPU wheels: jax 0.10.2 pulls
        # jaxlib and scipy, ~120 MB of downloads, and changes none of TensorFlow's NumPy or
        # ml_dtypes. (Keras' PyTorch backend is not tested: torch comes only with `convert`.)
        "jax": ["jax>=0.10"],
        # Benchmarks only: PyTorch eager as the reference; psutil for peak RSS.
        "bench": ["torch>=2.4", "psutil>=5.9"],
        # `keras_preact.export.runtimes` (export --format onnx|litert|openvino) and its tests;
        # tested with onnxruntime 1.32, onnx 1.23, tf2onnx 1.17, ai-edge-litert 2.3, openvino
        # 2026.4, none of which changes the TensorFlow, Keras, NumPy or protobuf that TF 2.21
        # installs.
        "deploy": [
            # The TF -> ONNX converter (Keras' ONNX export uses it too); 1.17 runs on NumPy 2.
            "tf2onnx>=1.17",
            # Writes the .onnx file with the class names in its metadata_props.
            "onnx>=1.17",
            # Runs the .onnx artifacts (tests, benchmarks/serving_speed.py).
            "onnxruntime>=1.20",
            # Runs the .tflite artifacts (TF's own tf.lite.Interpreter is deprecated); the
            # converter is TensorFlow's.
            "ai-edge-litert>=2.0",
            # Converts to OpenVINO IR (openvino.convert_model) and runs it.
            "openvino>=2025.0",
        ],
    },
    entry_points={"console_scripts": ["keras-preact=keras_preact.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
