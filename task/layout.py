"""Memory layouts that make convolutions fast: channels-last (NHWC) weights and images.

oneDNN, torch's CPU convolution library, runs channels-last convolutions without the
reorders it needs for the default NCHW layout. Measured on this project's 2-core CPU
machine (one torch thread, SGD steps of cnn-mcmahan, B = 32): 26.4-27.5 ms per step
channels-last against 31.6-35.1 ms contiguous; the test-set evaluation about 1.6x faster.
The layout changes the order of float operations inside a convolution, not the model: the
numbers agree to float rounding, and one layout gives the same bits on every runtime.
"""

from __future__ import annotations

import torch


def convolves_images(model: torch.nn.Module, image_dims: int) -> bool:
    """Whether ``model`` has a 2-d convolution and its inputs are 4-d image batches."""
    return image_dims == 4 and any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def inference_layout(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.nn.Module, torch.Tensor]:
    """``model`` and images ``x`` in channels-last memory when the model convolves 4-d
    images, on any device; otherwise both as they are."""
    if convolves_images(model, x.dim()):
        return (model.to(memory_format=torch.channels_last),
                x.contiguous(memory_format=torch.channels_last))
    return model, x


def training_layout(model: torch.nn.Module, input_shape: tuple[int, ...]) -> torch.nn.Module:
    """``model`` (in place) with channels-last weights when it convolves images of
    ``input_shape`` (C, H, W) on the CPU, where oneDNN trains 1.03-1.35x faster so
    (cnn-mcmahan, cnn-small, lenet-gn, cnn-fedveca, cnn-small-moon; never slower); on
    CUDA it is left as it is: there channels-last steps were 0.85-1.03x as fast (an H200;
    ``python -m simulation bench layout`` measures both on the device at hand). Received
    weights loaded with ``load_state_dict`` keep the layout; images need not change (a
    convolution with channels-last weights takes either layout)."""
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if on_cpu and convolves_images(model, len(input_shape) + 1):
        model.to(memory_format=torch.channels_last)
    return model
