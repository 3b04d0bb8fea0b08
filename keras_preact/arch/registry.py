"""The registry: every network the paper trains or ablates, one spec per name.

`resnet-*` use the original post-activation unit (Fig. 4a), `preact-*` full pre-activation
(Fig. 4e). What the paper reports for each is in `keras_preact.paper`.
"""

from __future__ import annotations

from keras_preact.arch.specs import ResNetSpec, register, units_for_depth

# The depths of timm's ResNetV2 with BatchNorm (`resnetv2_18` ... `resnetv2_101`), each
# registered as `preact-{depth}-imagenet-timm` (`keras_preact.weights.timm.ARCHS`).
TIMM_DEPTHS = (18, 34, 50, 101)


def _cifar(name: str, block: str, depth: int, unit: str, **kw) -> None:
    register(name, ResNetSpec("cifar", block, units_for_depth("cifar", block, depth), unit=unit,
                              **kw))


def _imagenet(name: str, block: str, depth: int, unit: str, **kw) -> None:
    units = units_for_depth("imagenet", block, depth)
    register(name, ResNetSpec("imagenet", block, units, unit=unit, classes=1000,
                              input_shape=(224, 224, 3), **kw))


# --- CIFAR, original unit (Fig. 4a). 20-56 and 1202 are the ResNet paper's (2015).
for _depth in (20, 32, 44, 56, 110, 1202):
    _cifar(f"resnet-{_depth}", "basic", _depth, "original")
for _depth in (164, 1001):
    _cifar(f"resnet-{_depth}", "bottleneck", _depth, "original")

# --- CIFAR, full pre-activation (Fig. 4e).
for _depth in (20, 32, 44, 56, 110):
    _cifar(f"preact-{_depth}", "basic", _depth, "full-preact")
for _depth in (164, 1001):
    _cifar(f"preact-{_depth}", "bottleneck", _depth, "full-preact")

# --- Table 2: activation placement (Fig. 4 b-d) at depths 110 and 164.
for _unit in ("bn-after-add", "relu-before-add", "relu-only-preact"):
    _cifar(f"resnet-110-{_unit}", "basic", 110, _unit)
    _cifar(f"resnet-164-{_unit}", "bottleneck", 164, _unit)

# --- Table 1: shortcut variants (Fig. 2) on the original ResNet-110, at the settings whose
# errors the paper reports (`keras_preact.paper`).
for _shortcut, _kw in [
    ("constant-scaling", {"residual_scale": 0.5}),
    ("exclusive-gating", {"gate_bias": -6.0}),
    ("shortcut-only-gating", {}),
    ("conv1x1", {}),
    ("dropout", {}),
]:
    _cifar(f"resnet-110-{_shortcut}", "basic", 110, "original", shortcut=_shortcut, **_kw)

# --- Table 3: units of a single 3x3 conv ("1-layer skip"), 110 layers.
_cifar("resnet-110-single", "single", 110, "original")
_cifar("preact-110-single", "single", 110, "full-preact")

# --- ImageNet (fb.resnet.torch resnet.lua / preresnet.lua).
for _prefix, _unit in [("resnet", "original"), ("preact", "full-preact")]:
    for _depth in (18, 34, 50, 101, 152, 200):
        _block = "basic" if _depth < 50 else "bottleneck"
        _imagenet(f"{_prefix}-{_depth}-imagenet", _block, _depth, _unit)

# --- timm's ResNetV2 with BatchNorm (`resnetv2_18/34/50/101`): pre-activation nets whose stem
# is conv - max-pool (the first unit pre-activates the pooled output) and whose convs pad as
# PyTorch does, the network of timm's ImageNet checkpoints (`keras_preact.weights.timm`).
for _depth in TIMM_DEPTHS:
    _imagenet(f"preact-{_depth}-imagenet-timm", "basic" if _depth < 50 else "bottleneck", _depth,
              "full-preact", stem="conv-pool", padding="symmetric")
