"""ckpt: automatic activation checkpointing inside torch.compile.

Use it with ``torch.compile(model, backend="ckpt")``; no import is needed once
the package is installed.  See the README for the environment variables.
"""

__version__ = "0.1.0"
