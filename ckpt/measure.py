"""Measure the activation bytes a forward pass saves for its backward.

This counts exactly what ckpt's budget counts: the storages of the tensors
that autograd (eager or compiled) saves, each storage once, leaving out the
storages of tensors that live anyway (parameters, buffers, the inputs).  It
uses :class:`torch.autograd.graph.saved_tensors_hooks`.

Modules are read at the moment each tensor is saved, not once at the start:
under FSDP2 a module holds its unsharded parameters only while its forward
runs, and those are parameters, not activations.  Distributed tensors count
by their local shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

__all__ = ["SavedActivations", "live_storages", "saved_activations"]

Live = Iterable[torch.Tensor] | torch.nn.Module | torch.Tensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor: its shard on this rank
    return to_local() if callable(to_local) else tensor


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr())


def live_storages(*groups: Live) -> set[tuple[str, int]]:
    """Storage keys of tensors that live anyway: pass modules, tensors or iterables of tensors."""
    keys: set[tuple[str, int]] = set()
    for group in groups:
        if isinstance(group, torch.nn.Module):
            tensors: Iterable[torch.Tensor] = [*group.parameters(), *group.buffers()]
        elif isinstance(group, torch.Tensor):
            tensors = [group]
        else:
            tensors = group
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor):
                keys.add(_storage_key(_local(tensor)))
    return keys


@dataclass
class SavedActivations:
    """The unique storages saved for backward while the context was open."""

    excluded: set[tuple[str, int]]
    modules: list[torch.nn.Module] = field(default_factory=list)
    storages: dict[tuple[str, int], int] = field(default_factory=dict)
    tensors: int = 0

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.tensors += 1
        key = _storage_key(tensor)
        if key not in self.excluded and (not self.modules or key not in live_storages(*self.modules)):
            self.storages[key] = tensor.untyped_storage().nbytes()
        return tensor


@contextlib.contextmanager
def saved_activations(*live: Live) -> Iterator[SavedActivations]:
    """Count saved activation bytes inside the block.

    ``live`` names what lives anyway (the model, the inputs); its storages are
    not counted::

        with saved_activations(model, x) as saved:
            loss = model(x)
        print(saved.bytes)
    """
    modules = [group for group in live if isinstance(group, torch.nn.Module)]
    others = [group for group in live if not isinstance(group, torch.nn.Module)]
    record = SavedActivations(excluded=live_storages(*others), modules=modules)
    # The hook can run inside compiled code; Dynamo must not trace it.
    pack = torch.compiler.disable(record._pack)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield record
