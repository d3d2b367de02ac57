"""What the partitioner decided, one :class:`PartitionRecord` per joint graph.

The backend publishes a record for every graph it partitions (or falls back
on).  Anyone may listen: :func:`record_partitions` collects the records made
inside a block, and :func:`subscribe` registers a function called with each
record as it is published (the explain report written for ``CKPT_EXPLAIN``
is one such subscriber).  This module sits below the backend and the tools,
so both import it and neither imports the other.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt.config import Budget
    from ckpt.cost_model.profiles import DeviceProfile
    from ckpt.partitioner.analysis import JointAnalysis
    from ckpt.partitioner.peak import PeakGraph, PeakPrediction
    from ckpt.partitioner.plan import Plan
    from ckpt.partitioner.problem import RegionCap

__all__ = ["PartitionRecord", "publish", "record_partitions", "subscribe", "unsubscribe"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionRecord:
    """What the partitioner decided for one joint graph.

    ``analysis`` and ``plan`` are None when the graph fell back to torch's
    partition (``fallback_reason`` says why).  ``torch_plan`` is torch's
    default partition in ckpt's terms, evaluated only when explaining.
    ``explain`` is the ``CKPT_EXPLAIN`` target the graph compiled with;
    ``peak`` the plan's predicted peak, from ``peak_graph`` (which predicts
    any plan's peak on this graph).
    """

    graph: str
    analysis: JointAnalysis | None
    plan: Plan | None
    budget: Budget
    budget_bytes: int | None
    profile: DeviceProfile
    solve_seconds: float
    fallback_reason: str | None = None
    torch_plan: Plan | None = None
    explain: str | None = None
    peak_graph: PeakGraph | None = None  # the graph's liveness data, for predicting any plan's peak
    peak: PeakPrediction | None = None  # the plan's predicted peak
    peak_cap_bytes: int | None = None  # CKPT_PEAK_MEMORY resolved for this graph (None: no cap)
    region_caps: tuple[RegionCap, ...] = ()  # per-module budgets resolved for this graph

    @property
    def planned(self) -> tuple[JointAnalysis, Plan] | None:
        """The analysis and the plan, or None for a graph that fell back."""
        if self.plan is None or self.analysis is None:
            return None
        return self.analysis, self.plan

    @property
    def fingerprint(self) -> str | None:
        """A short hash of the plan's decisions, equal on every rank that makes the same plan."""
        if self.plan is None or self.analysis is None:
            return None
        if not self.region_caps:
            return self.plan.fingerprint(self.analysis.problem)
        regions = ";".join(f"{cap.label}={cap.max_bytes}" for cap in self.region_caps)
        text = self.plan.fingerprint(self.analysis.problem) + "|regions:" + regions
        return hashlib.sha256(text.encode()).hexdigest()[:16]


Subscriber = Callable[[PartitionRecord], None]

_lock = threading.Lock()
_collectors: list[list[PartitionRecord]] = []
_subscribers: list[Subscriber] = []


@contextlib.contextmanager
def record_partitions() -> Iterator[list[PartitionRecord]]:
    """Collect a :class:`PartitionRecord` for every graph partitioned inside the block."""
    records: list[PartitionRecord] = []
    with _lock:
        _collectors.append(records)
    try:
        yield records
    finally:
        with _lock:
            _collectors.remove(records)


def subscribe(subscriber: Subscriber) -> None:
    """Call ``subscriber(record)`` for every record published from now on (once, however often subscribed)."""
    with _lock:
        if subscriber not in _subscribers:
            _subscribers.append(subscriber)


def unsubscribe(subscriber: Subscriber) -> None:
    with _lock:
        if subscriber in _subscribers:
            _subscribers.remove(subscriber)


def publish(record: PartitionRecord) -> None:
    """Hand ``record`` to every open :func:`record_partitions` block and every subscriber.

    A subscriber that raises is logged and skipped: listeners must never
    change how a graph compiles.
    """
    with _lock:
        collectors = list(_collectors)
        subscribers = list(_subscribers)
    for records in collectors:
        records.append(record)
    for subscriber in subscribers:
        try:
            subscriber(record)
        except Exception:  # a listener's bug must not change how the graph compiles
            log.warning("ckpt: a partition-record subscriber failed on graph %r", record.graph, exc_info=True)
