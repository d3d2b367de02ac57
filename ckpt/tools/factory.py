"""Model factories for the command line: ``python -m ckpt explain module:factory``.

A factory is a function that takes no arguments and returns the model and its
example inputs, either as ``(model, (input1, input2, ...))`` or, for a model
with one input, as ``(model, input)``.  ``model`` is a ``torch.nn.Module``; the
example inputs are what ``model(*inputs)`` is called with.

:func:`demo_factory` is one for the demo GPT::

    python -m ckpt explain ckpt.tools.factory:demo_factory --budget 0.3
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["FactoryError", "call_factory", "conv_factory", "demo_factory", "gpt_factory", "load_factory", "mlp_factory"]

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_SPEC_RE = re.compile(rf"^(?P<module>{_DOTTED}):(?P<attr>{_DOTTED})$")
_FORM = "'module:factory', for example 'ckpt.tools.factory:demo_factory' or 'mymodels:make_model'"
_RETURNS = "(model, (inputs...)) or (model, input), with model a torch.nn.Module"


class FactoryError(ValueError):
    """A ``module:factory`` string that cannot be loaded, or a factory that returns the wrong thing."""


def load_factory(spec: str) -> Callable[[], Any]:
    """The function named by ``spec`` (``"package.module:function"``)."""
    match = _SPEC_RE.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise FactoryError(f"factory {spec!r} is not of the form {_FORM}")
    module_name, attr_path = match["module"], match["attr"]
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise FactoryError(
                f"factory {spec!r}: no module named {error.name!r} "
                "(run from the directory that holds it, or put it on PYTHONPATH)"
            ) from error
        raise  # the module exists but one of its own imports is missing: show the real error
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise FactoryError(f"factory {spec!r}: {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise FactoryError(f"factory {spec!r}: {attr_path!r} is a {type(target).__name__}, not a function")
    try:
        inspect.signature(target).bind()
    except TypeError as error:
        raise FactoryError(f"factory {spec!r} must take no arguments, but calling it so fails: {error}") from None
    except ValueError:  # no signature to inspect (some builtins): let the call decide
        pass
    return target


def check_factory_result(spec: str, result: Any) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """``(model, inputs)`` from what a factory returned, or a FactoryError saying what was wrong."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        described = f"a {type(result).__name__}"
        if isinstance(result, (tuple, list)):
            described += f" of length {len(result)}"
        raise FactoryError(f"factory {spec!r} returned {described}; it must return {_RETURNS}")
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        raise FactoryError(
            f"factory {spec!r} returned a {type(model).__name__} as the model; it must return {_RETURNS}"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise FactoryError(
            f"factory {spec!r} returned a {type(inputs).__name__} as the inputs; it must return {_RETURNS}"
        )
    return model, tuple(inputs)


def call_factory(spec: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Load the factory named by ``spec``, call it, and check what it returns."""
    return check_factory_result(spec, load_factory(spec)())


def demo_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A small demo GPT (2 layers, width 64, 64 tokens, batch 4) and a batch of token ids and targets."""
    from ckpt.tools.demo import DemoGPT

    torch.manual_seed(0)
    model = DemoGPT(vocab=128, dim=64, layers=2, heads=4, seq=64)
    tokens = torch.randint(0, 128, (4, 65), generator=torch.Generator().manual_seed(1))
    return model, (tokens[:, :-1], tokens[:, 1:])


# --- models for ``python -m ckpt validate``: big enough that recomputation shows above timing noise ---


class _ResidualMLP(torch.nn.Module):
    def __init__(self, dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(dim) for _ in range(layers))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(dim, hidden) for _ in range(layers))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(hidden, dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(torch.nn.functional.gelu(up(norm(x))))
        return x.square().mean()


class _ConvNet(torch.nn.Module):
    def __init__(self, channels: int, layers: int) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(channels, channels, 3, padding=1) for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(channels) for _ in range(layers))
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for conv, norm in zip(self.convs, self.norms):
            x = x + torch.relu(norm(conv(x)))
        return torch.nn.functional.cross_entropy(self.head(x.mean(dim=(2, 3))), labels)


def gpt_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The demo GPT at width 128, 2 layers, 128 tokens, batch 8."""
    from ckpt.tools.demo import DemoGPT

    torch.manual_seed(0)
    model = DemoGPT(vocab=256, dim=128, layers=2, heads=4, seq=128)
    tokens = torch.randint(0, 256, (8, 129), generator=torch.Generator().manual_seed(1))
    return model, (tokens[:, :-1], tokens[:, 1:])


def mlp_factory() -> tuple[torch.nn.Module, torch.Tensor]:
    """A residual GELU MLP (3 blocks, 256 -> 1024 -> 256) on a batch of 512 rows."""
    torch.manual_seed(0)
    return _ResidualMLP(256, 1024, 3), torch.randn(512, 256)


def conv_factory() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A residual conv net (4 conv-BN-ReLU blocks, 32 channels) on 16 images of 32x32."""
    torch.manual_seed(0)
    images = torch.randn(16, 3, 32, 32)
    labels = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1))
    return _ConvNet(32, 4), (images, labels)
