"""The paper's results, kept apart from the architectures (as timm keeps pretrained cfgs apart).

One entry per registered name whose exact network the paper reports, as `keras-preact list`
prints it: test error in %, CIFAR-10 unless stated; ImageNet single-crop top-1 / top-5 error.
resnet-20 to 56 and resnet-1202 come from the ResNet paper (He et al. 2015). A network changed
by `build` overrides is not the paper's: it has no figure (`paper_result`).
"""

from __future__ import annotations

import dataclasses

from keras_preact.arch.specs import HEAD_FIELDS, get_spec, resolve

PAPER_RESULTS = {
    # Original unit (Fig. 4a).
    "resnet-20": "8.75 (He et al. 2015)",
    "resnet-32": "7.51 (He et al. 2015)",
    "resnet-44": "7.17 (He et al. 2015)",
    "resnet-56": "6.97 (He et al. 2015)",
    "resnet-110": "6.61 (Table 1-3)",
    "resnet-1202": "7.93 (He et al. 2015)",
    "resnet-164": "5.93; CIFAR-100 25.16 (Table 3)",
    "resnet-1001": "7.61; CIFAR-100 27.82 (Table 3)",
    # Full pre-activation (Fig. 4e).
    "preact-110": "6.37 (Table 2, 3)",
    "preact-164": "5.46; CIFAR-100 24.33 (Table 3)",
    "preact-1001": "4.92 (4.62 at batch 64); CIFAR-100 22.71 (Table 4)",
    # Table 2: activation placement (Fig. 4 b-d).
    "resnet-110-bn-after-add": "8.17 (Table 2)",
    "resnet-164-bn-after-add": "6.50 (Table 2)",
    "resnet-110-relu-before-add": "7.84 (Table 2)",
    "resnet-164-relu-before-add": "6.14 (Table 2)",
    "resnet-110-relu-only-preact": "6.71 (Table 2)",
    "resnet-164-relu-only-preact": "5.91 (Table 2)",
    # Table 1: shortcut variants (Fig. 2) on ResNet-110.
    "resnet-110-constant-scaling": "12.35 (Table 1, 0.5 / 0.5)",
    "resnet-110-exclusive-gating": "8.70 (Table 1, b_g = -6)",
    "resnet-110-shortcut-only-gating": "12.86 (Table 1, b_g = 0)",
    "resnet-110-conv1x1": "12.22 (Table 1)",
    "resnet-110-dropout": "fails (> 20, Table 1)",
    # Table 3: 1-layer skip.
    "resnet-110-single": "9.90 (Table 3)",
    "preact-110-single": "8.91 (Table 3)",
    # Table 5: ImageNet, trained on 224 crops, tested on 320 crops.
    "resnet-152-imagenet": "21.3 / 5.5 top-1/5 at 320 (Table 5)",
    "preact-152-imagenet": "21.1 / 5.5 top-1/5 at 320 (Table 5)",
    "resnet-200-imagenet": "21.8 / 6.0 top-1/5 at 320 (Table 5)",
    "preact-200-imagenet": "20.7 / 5.3 top-1/5 at 320 (Table 5)",
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The numbers of a training recipe; `lr_drops`: the fractions of `steps` at which the
    learning rate is divided by 10."""

    batch_size: int
    steps: int
    lr: float
    lr_drops: tuple[float, ...]
    warmup_steps: int
    warmup_lr: float
    momentum: float
    weight_decay: float


# The paper's CIFAR recipe (Appendix; resnet-1k-layers): what `training.TrainConfig`,
# `optim.SGDWithL2` and `optim.PaperSchedule` default to. 64k iterations = 164 epochs of 390.
CIFAR_RECIPE = Recipe(batch_size=128, steps=64000, lr=0.1, lr_drops=(0.5, 0.75),
                      warmup_steps=400, warmup_lr=0.01, momentum=0.9, weight_decay=1e-4)
# fb.resnet.torch's ImageNet schedule: /10 at epochs 30 and 60 of 90.
IMAGENET_LR_DROPS = (1 / 3, 2 / 3)


def paper_result(name: str, **overrides) -> str:
    """The paper's test error for registered network `name`, "" if it reports none.

    With `build` overrides, "" unless they only change `specs.HEAD_FIELDS` or repeat the
    registered values: anything else is a network the paper did not train.

    Example:
    >>> paper_result("preact-164")
    '5.46; CIFAR-100 24.33 (Table 3)'
    >>> paper_result("preact-164", include_top=False), paper_result("preact-164", depth=110)
    ('5.46; CIFAR-100 24.33 (Table 3)', '')
    """
    registered = get_spec(name)
    kept = {field: getattr(registered, field) for field in HEAD_FIELDS}
    if overrides and dataclasses.replace(resolve(name, **overrides), **kept) != registered:
        return ""
    return PAPER_RESULTS.get(name, "")
