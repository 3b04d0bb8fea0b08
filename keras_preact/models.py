"""The registry: every network the paper trains or ablates, one spec per name.

`resnet-*` use the original post-activation unit (Fig. 4a), `preact-*` full pre-activation
(Fig. 4e). Paper results are CIFAR-10 test error (%) unless marked otherwise.
"""

from __future__ import annotations

from keras_preact.specs import ResNetSpec, register, units_for_depth


def _cifar(name: str, block: str, depth: int, unit: str, result: str = "", **kw) -> None:
    units = units_for_depth("cifar", block, depth)
    register(name, ResNetSpec("cifar", block, units, unit=unit, paper_result=result, **kw))


def _imagenet(name: str, block: str, depth: int, unit: str, result: str = "") -> None:
    register(
        name,
        ResNetSpec(
            "imagenet",
            block,
            units_for_depth("imagenet", block, depth),
            unit=unit,
            classes=1000,
            input_shape=(224, 224, 3),
            paper_result=result,
        ),
    )


# --- CIFAR, original unit (Fig. 4a). 20-56 and 1202 come from the ResNet paper (2015).
for _depth, _result in [
    (20, "8.75 (He et al. 2015)"),
    (32, "7.51 (He et al. 2015)"),
    (44, "7.17 (He et al. 2015)"),
    (56, "6.97 (He et al. 2015)"),
    (110, "6.61 (Table 1-3)"),
    (1202, "7.93 (He et al. 2015)"),
]:
    _cifar(f"resnet-{_depth}", "basic", _depth, "original", _result)
_cifar("resnet-164", "bottleneck", 164, "original", "5.93; CIFAR-100 25.16 (Table 3)")
_cifar("resnet-1001", "bottleneck", 1001, "original", "7.61; CIFAR-100 27.82 (Table 3)")

# --- CIFAR, full pre-activation (Fig. 4e).
for _depth in (20, 32, 44, 56):
    _cifar(f"preact-{_depth}", "basic", _depth, "full-preact")
_cifar("preact-110", "basic", 110, "full-preact", "6.37 (Table 2, 3)")
_cifar("preact-164", "bottleneck", 164, "full-preact", "5.46; CIFAR-100 24.33 (Table 3)")
_cifar(
    "preact-1001",
    "bottleneck",
    1001,
    "full-preact",
    "4.92 (4.62 at batch 64); CIFAR-100 22.71 (Table 4)",
)

# --- Table 2: activation placement (Fig. 4 b-d) at depths 110 and 164.
for _unit, _results in [
    ("bn-after-add", ("8.17", "6.50")),
    ("relu-before-add", ("7.84", "6.14")),
    ("relu-only-preact", ("6.71", "5.91")),
]:
    _cifar(f"resnet-110-{_unit}", "basic", 110, _unit, f"{_results[0]} (Table 2)")
    _cifar(f"resnet-164-{_unit}", "bottleneck", 164, _unit, f"{_results[1]} (Table 2)")

# --- Table 1: shortcut variants (Fig. 2) on the original ResNet-110.
for _shortcut, _result, _kw in [
    ("constant-scaling", "12.35 (Table 1, 0.5 / 0.5)", {"residual_scale": 0.5}),
    ("exclusive-gating", "8.70 (Table 1, b_g = -6)", {"gate_bias": -6.0}),
    ("shortcut-only-gating", "12.86 (Table 1, b_g = 0)", {}),
    ("conv1x1", "12.22 (Table 1)", {}),
    ("dropout", "fails (> 20, Table 1)", {}),
]:
    _cifar(f"resnet-110-{_shortcut}", "basic", 110, "original", _result, shortcut=_shortcut, **_kw)

# --- Table 3: units of a single 3x3 conv ("1-layer skip"), 110 layers.
_cifar("resnet-110-single", "single", 110, "original", "9.90 (Table 3)")
_cifar("preact-110-single", "single", 110, "full-preact", "8.91 (Table 3)")

# --- ImageNet (fb.resnet.torch resnet.lua / preresnet.lua). Top-1/top-5 single 224 crop.
_IMAGENET_RESULTS = {
    ("original", 152): "21.3 / 5.5 top-1/5 at 320 (Table 5)",
    ("full-preact", 152): "21.1 / 5.5 top-1/5 at 320 (Table 5)",
    ("original", 200): "21.8 / 6.0 top-1/5 at 320 (Table 5)",
    ("full-preact", 200): "20.7 / 5.3 top-1/5 at 320 (Table 5)",
}
for _prefix, _unit in [("resnet", "original"), ("preact", "full-preact")]:
    for _depth in (18, 34, 50, 101, 152, 200):
        _block = "basic" if _depth < 50 else "bottleneck"
        _imagenet(
            f"{_prefix}-{_depth}-imagenet",
            _block,
            _depth,
            _unit,
            _IMAGENET_RESULTS.get((_unit, _depth), ""),
        )
