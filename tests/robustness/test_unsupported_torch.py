"""On torch older than 2.9, backend="ckpt" fails when the model compiles, naming the version it needs."""

from __future__ import annotations

import pytest
import torch

import ckpt._torch_compat as compat
from ckpt._torch_compat import UnsupportedTorchError
from tests.robustness.helpers import error_chain


@pytest.mark.compat
def test_check_names_the_required_version():
    with pytest.raises(UnsupportedTorchError, match=r"torch>=2\.9"):
        compat.check_torch_version((2, 8))
    compat.check_torch_version((2, 9))


@pytest.mark.compile
@pytest.mark.compat
def test_compiling_on_torch_2_8_fails_naming_the_required_version(monkeypatch):
    monkeypatch.setattr(compat, "torch_version", lambda: (2, 8))
    model = torch.nn.Linear(4, 4)
    compiled = torch.compile(model, backend="ckpt")  # compiling is lazy: the first call compiles
    with pytest.raises(Exception) as raised:
        compiled(torch.randn(2, 4, requires_grad=True))
    errors = [error for error in error_chain(raised.value) if isinstance(error, UnsupportedTorchError)]
    assert errors, f"no UnsupportedTorchError in {raised.value!r}"
    assert "torch>=2.9" in str(errors[0])
    assert "torch>=2.9" in str(raised.value), "the user sees the required version in the error that reaches them"
