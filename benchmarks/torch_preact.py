"""PyTorch eager reference of keras_preact's full pre-activation nets (benchmark only).

Built from the same `ResNetSpec` as `keras_preact.build`, with the same layers, shapes and
trainable parameter count (asserted by `train_speed.py --compare torch`): shared
pre-activation on each stage's first unit, stride on the 3x3 conv, 1x1 projection where the
shape changes, final BN-ReLU, global average pool, linear. Torch's own BN defaults (momentum
0.1, eps 1e-5) are the ones the Keras layers copy. Needs the `bench` extra (torch).

Example:
>>> import keras_preact
>>> net = PreActResNet(keras_preact.resolve("preact-164"))
>>> trainable_params(net)
1703258
"""

from __future__ import annotations

import torch
from torch import nn

from keras_preact.arch import blocks
from keras_preact.arch.specs import EXPANSION, ResNetSpec


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(inplace=True))


class Unit(nn.Module):
    """`shortcut + F(pre(x))`; the first unit of a stage feeds `pre(x)` to both paths."""

    def __init__(self, spec: ResNetSpec, c_in: int, width: int, stride: int, first: bool,
                 skip_pre: bool):
        super().__init__()
        self.first = first
        self.pre = nn.Identity() if skip_pre else _bn_relu(c_in)
        layers, c = [], c_in
        convs = blocks.branch_convs(spec, width, stride)
        for k, (filters, kernel, s) in enumerate(convs):
            if k:
                layers.append(_bn_relu(c))
            layers.append(nn.Conv2d(c, filters, kernel, s, padding=kernel // 2, bias=False))
            c = filters
        self.branch = nn.Sequential(*layers)
        self.projection = (nn.Conv2d(c_in, c, 1, stride, bias=False)
                           if stride != 1 or c_in != c else None)

    def forward(self, x):
        pre = self.pre(x)
        shortcut = pre if self.first else x
        if self.projection is not None:
            shortcut = self.projection(shortcut)
        return shortcut + self.branch(pre)


class PreActResNet(nn.Module):
    """The network of a full pre-activation, identity-shortcut `spec` (NCHW input)."""

    def __init__(self, spec: ResNetSpec):
        super().__init__()
        if spec.unit != "full-preact" or spec.shortcut != "identity" or not spec.include_top:
            raise ValueError("The torch reference covers full pre-activation nets with identity "
                             f"shortcuts and a classifier. Received: unit={spec.unit!r}, "
                             f"shortcut={spec.shortcut!r}, include_top={spec.include_top!r}")
        c = spec.stem_width
        if spec.family == "imagenet":
            stem = [nn.Conv2d(3, c, 7, 2, padding=3, bias=False), *_bn_relu(c),
                    nn.MaxPool2d(3, 2, padding=1)]
        else:
            stem = [nn.Conv2d(3, c, 3, 1, padding=1, bias=False)]
        units = []
        for s, (n_units, width) in enumerate(zip(spec.units, spec.widths), start=1):
            for u in range(1, n_units + 1):
                units.append(Unit(spec, c, width, 2 if (u == 1 and s > 1) else 1, u == 1,
                                  spec.family == "imagenet" and s == 1 and u == 1))
                c = width * EXPANSION[spec.block]
        self.features = nn.Sequential(*stem, *units, *_bn_relu(c))
        self.classifier = nn.Linear(c, spec.classes)
        for m in self.modules():  # the Keras initializers (blocks.conv_init: He, fan-out)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.classifier.bias)  # as the Keras Dense (and the references)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def trainable_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def train_steps(spec: ResNetSpec, batch_size: int, steps: int, config: str = "eager",
                device: str = "cpu"):
    """Builds the net and runs `steps` SGD steps (momentum 0.9, weight decay 1e-4, the
    paper's recipe) on one synthetic batch in PyTorch configuration `config`
    (`train_speed.TORCH_CONFIGS`) on `device` ("cpu", or "cuda": each step's time then ends
    when the GPU has finished it). Returns (build seconds, per-step seconds, trainable
    parameters)."""
    import contextlib
    import time

    start = time.perf_counter()
    net = PreActResNet(spec)
    build_s = time.perf_counter() - start
    h, w, _ = spec.input_shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, 3, h, w, generator=generator)
    y = torch.randint(0, spec.classes, (batch_size,), generator=generator)
    net, x, y = net.to(device), x.to(device), y.to(device)
    if config != "eager":
        net, x = net.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    device_type = torch.device(device).type
    precision = (torch.autocast(device_type, dtype=torch.bfloat16) if config.endswith("bf16")
                 else contextlib.nullcontext())
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with precision:
            loss = loss_fn(net(x), y)
        loss.backward()
        optimizer.step()
        sync()
        times.append(time.perf_counter() - start)
    return build_s, times, trainable_params(net)
