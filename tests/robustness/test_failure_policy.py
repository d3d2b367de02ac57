"""Failure policy: a planner failure falls back to torch's partition, or raises under strict mode.

The failure is injected by replacing the solver the partitioner calls
(``ckpt.backend.solve``) with one that raises.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
import torch.nn as nn

import ckpt.backend
from ckpt.backend import CkptPartitionError
from tests.robustness.helpers import assert_runs_close, ckpt_compile, error_chain, run_steps

pytestmark = [pytest.mark.compile, pytest.mark.compat]

DIM = 16
INJECTED = "injected solver failure"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, DIM)
        self.fc2 = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)).square()).sin().sum()


def _failing_solve(*args: object, **kwargs: object) -> None:
    raise RuntimeError(INJECTED)


def _batches(steps: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(8)
    return [[torch.randn(8, DIM, generator=generator, requires_grad=True)] for _ in range(steps)]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_outside_strict_mode_a_failure_warns_and_training_continues(monkeypatch, caplog, how):
    """One warning naming the graph and the reason; torch's partition; three SGD steps equal eager's."""
    if how == "option":  # the option overrides CKPT_STRICT=1
        monkeypatch.setenv("CKPT_STRICT", "1")
        options = {"strict": False}
    else:
        monkeypatch.setenv("CKPT_STRICT", "0")
        options = {}
    torch.manual_seed(0)
    model = Net()
    batches = _batches(3)
    want, _ = run_steps(model, batches, lr=0.1)
    default_compile, _ = run_steps(model, batches, compile_fn=lambda m: torch.compile(m, backend="inductor"), lr=0.1)
    monkeypatch.setattr(ckpt.backend, "solve", _failing_solve)
    with caplog.at_level(logging.WARNING, logger="ckpt.backend"):
        got, _ = run_steps(model, batches, compile_fn=lambda m: ckpt_compile(m, "0.5", options=options), lr=0.1)
    assert_runs_close(got, want)
    (record,) = got[0].records
    assert record.plan is None and record.fallback_reason is not None and INJECTED in record.fallback_reason
    warnings = [r for r in caplog.records if r.name == "ckpt.backend" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert record.graph in message and INJECTED in message and "default partition" in message
    # torch's partition saves what default torch.compile saves.
    assert [step.saved_bytes for step in got] == [step.saved_bytes for step in default_compile]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_strict_mode_raises_naming_the_graph_and_the_reason(monkeypatch, how):
    if how == "option":  # the option overrides CKPT_STRICT=0
        monkeypatch.setenv("CKPT_STRICT", "0")
        options = {"strict": True}
    else:
        monkeypatch.setenv("CKPT_STRICT", "1")
        options = {}
    monkeypatch.setattr(ckpt.backend, "solve", _failing_solve)
    torch.manual_seed(0)
    with pytest.raises(Exception) as raised:
        run_steps(Net(), _batches(1), compile_fn=lambda m: ckpt_compile(m, "0.5", options=options))
    errors = [error for error in error_chain(raised.value) if isinstance(error, CkptPartitionError)]
    assert errors, f"no CkptPartitionError in {raised.value!r}"
    message = str(errors[0])
    assert re.search(r"graph '[^']+'", message), message
    assert f"RuntimeError: {INJECTED}" in message
    assert INJECTED in str(raised.value), "the user sees the reason in the error that reaches them"
