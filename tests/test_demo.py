"""``python -m ckpt demo``: equal losses in every row, each ckpt row within its cap."""

from __future__ import annotations

import io

import pytest

from ckpt.tools.demo import format_rows, run_demo

pytestmark = pytest.mark.compile


def test_demo_rows_agree_on_the_loss_and_keep_their_budgets():
    rows = run_demo(steps=2, device="cpu", stream=io.StringIO())
    assert [r.setting for r in rows] == [
        "torch.compile (default)",
        "ckpt, no cap",
        "ckpt, budget 0.5",
        "ckpt, budget 0.25",
    ]
    reference = rows[0].loss
    for row in rows:
        assert row.loss == pytest.approx(reference, rel=1e-5), f"{row.setting}: loss {row.loss} against {reference}"
        assert row.step_ms > 0 and row.peak_mib > row.activation_mib
    no_cap, half, quarter = rows[1:]
    assert no_cap.budget_mib is None
    for row in (half, quarter):
        assert row.budget_mib is not None and row.activation_mib <= row.budget_mib
    assert quarter.activation_mib < half.activation_mib < rows[0].activation_mib
    table = format_rows(rows, steps=2)
    assert "loss after 2 steps" in table and table.count("\n") == len(rows) + 1


def test_demo_needs_two_steps():
    with pytest.raises(ValueError, match="steps=1"):
        run_demo(steps=1, stream=io.StringIO())
