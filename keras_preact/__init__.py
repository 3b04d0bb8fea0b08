"""keras-preact: the networks of *Identity Mappings in Deep Residual Networks* (He et al.,
ECCV 2016) in Keras 3, by name.

Example:
>>> import keras_preact
>>> model = keras_preact.build("preact-164")
>>> model.count_params() > 1_700_000
True
>>> keras_preact.spec_of(model).block
'bottleneck'
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib

from keras_preact.arch import registry as _registry  # noqa: F401  (registers every name)
from keras_preact.arch.specs import ResNetSpec, get_spec, resolve
from keras_preact.paper import paper_result
from keras_preact.weights import published as _published  # noqa: F401  (registers every tag)
from keras_preact.weights.records import list_models

# What needs Keras (hence TensorFlow, seconds to import) loads on first use (PEP 562), so
# that `keras-preact --help` and `keras-preact list` answer at once.
_LAZY = {
    "MAX_LAYERS": "keras_preact.api",
    "build": "keras_preact.api",
    "build_from_spec": "keras_preact.arch.network",
    "feature_extractor": "keras_preact.api",
    "from_timm": "keras_preact.weights.timm",
    "load_model": "keras_preact.api",
    "scan": "keras_preact.arch.scan",  # the module itself
    "spec_of": "keras_preact.arch.network",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'keras_preact' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if module.__name__.endswith(f".{name}") else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "MAX_LAYERS",
    "ResNetSpec",
    "build",
    "build_from_spec",
    "feature_extractor",
    "from_timm",
    "get_spec",
    "list_models",
    "load_model",
    "paper_result",
    "resolve",
    "scan",
    "spec_of",
]
