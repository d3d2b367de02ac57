"""ckpt: automatic activation checkpointing inside torch.compile.

Use it with ``torch.compile(model, backend="ckpt")``; no import is needed once
the package is installed.  See the README for the environment variables.
"""

__version__ = "0.1.0"

_LAZY = {"explain": "ckpt.explainer", "pareto": "ckpt.tradeoff"}


def __getattr__(name: str):
    """``ckpt.explain`` and ``ckpt.pareto`` load on first use, so ``import ckpt`` stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ckpt' has no attribute {name!r}")
