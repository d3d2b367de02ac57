"""Per-module memory budgets: :func:`set_budget`, and how a compiled graph finds its modules.

``ckpt.set_budget(model.layers[0:8], 0.1)`` gives module objects a budget;
``ckpt.set_budget(model, {"layers.*.mlp": 0.1})`` does the same by path, and
``torch.compile(..., options={"memory_budget": {"layers.*.mlp": "0.1", "": "0.5"}})``
(or ``CKPT_MEMORY_BUDGET="0.5,layers.*.mlp=0.1"``) names modules by their path
in the compiled frame.  Each compiled graph applies the budgeted modules it
contains (:mod:`ckpt.partitioner.regions`).

**Finding a module in a graph.**  A compiled graph does not hold module
objects, only their parameters and buffers, which Dynamo passes as graph
inputs together with where it found them (``L['self'].layers.0.mlp.fc.weight``).
A budgeted module is placed in a frame through its own tensors: a tensor it
names ``fc.weight`` found at ``L['self'].layers.0.mlp.fc.weight`` puts it at
``L['self'].layers.0.mlp``.  When a graph break inside a module makes Dynamo
compile a submodule's forward as a frame of its own, that frame's paths start
at the submodule (``L['self'].fc.weight``); a budgeted module whose tensor
``mlp.fc.weight`` is found there contains the frame, and its budget covers the
whole graph.  A graph that holds none of a budgeted module's tensors but is
compiled while that module's forward runs (the part of the forward after a
graph break) takes the module's budget for all its values: Dynamo compiles a
frame while its caller runs, so the module is found as ``self`` of a frame on
the Python stack.  So a module split across graphs keeps its budget in each
part.  A module with no tensors of its own is placed through the module its
path was resolved from (:func:`set_budget` with a mapping).

**Guards.**  Dynamo reuses a frame's compiled graph for every object that
passes its guards, and parameters are graph inputs, so two instances of one
class (two blocks, or two copies of a model) share graphs.  Each module under
a budget therefore carries a small forward pre-hook that reads a tag: the
budgets over it and its path under each.  Dynamo traces the hook and guards on
the tag, so a graph compiled for a module under one budget is never run for a
module under another, while equally budgeted blocks share their graphs.  (A
graph found only on the stack has no such guard: it is reused for every
instance of the class, and :class:`ModuleBudgetWarning` says so.)

Paths in ``options`` are matched against the modules whose code the graph runs,
relative to the frame that Dynamo compiled (the module ``torch.compile`` was
given, when no graph break falls inside a submodule); :func:`set_budget`
follows module objects wherever Dynamo compiles them.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import re
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ckpt import _torch_compat as compat
from ckpt.config import Budget, parse_budget, validate_module_pattern
from ckpt.partitioner.regions import RegionSpec

__all__ = ["ModuleBudgetWarning", "clear_budgets", "frame_regions", "module_budgets", "set_budget"]

log = logging.getLogger(__name__)

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)
_TAG = "_ckpt_budget_tag"  # on every module under a budget: what the guard hook reads
_CARRIER = "_ckpt_budget"  # on every budgeted module: carries its budget into deep copies


class ModuleBudgetWarning(UserWarning):
    """A per-module budget that may not apply as meant: a path that matches no module of a graph,
    or a budget over a graph that Dynamo may reuse for modules under other budgets."""


@dataclass(frozen=True)
class _Entry:
    budget: Budget
    label: str
    anchor: tuple[weakref.ref[torch.nn.Module], str] | None  # (module the path was resolved from, path)


_lock = threading.RLock()
_registry: weakref.WeakKeyDictionary[torch.nn.Module, _Entry] = weakref.WeakKeyDictionary()
_tagged: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # modules carrying the tag and the guard hook
_warned: set[str] = set()


def _has_state(module: torch.nn.Module) -> bool:
    return any(True for _ in itertools.chain(module.parameters(), module.buffers()))


def set_budget(target: Any, budget: Any) -> None:
    """Give modules their own memory budget, kept by every graph that compiles them with ``backend="ckpt"``.

    * ``ckpt.set_budget(model.layers[0:8], 0.1)``: each module saves at most
      10% of what autograd saves for the values it computes.  A
      ``ModuleList`` or ``ModuleDict`` (or a slice of one, or any iterable of
      modules) stands for each module in it, each with its own cap; a
      ``Sequential`` is one module (for a slice of one, pass ``list(seq[2:4])``).
    * ``ckpt.set_budget(model, {"layers.*.mlp": 0.1, "layers.*.attn": "0.5"})``:
      by path under ``model``; ``*`` matches one path component, and ``""``
      is ``model`` itself.  A path that matches no module is an error that
      names the closest paths.
    * ``ckpt.set_budget(module, None)`` removes the module's budget.

    A budget is anything ``CKPT_MEMORY_BUDGET`` accepts: ``"none"``, a
    fraction such as 0.1 (of what autograd saves for the module's values in
    each graph), or a size such as ``"256MiB"`` (per module, per graph).  The
    most specific module wins; the rest of each graph takes the default budget.
    A budget change takes effect at the next compile: Dynamo's guards and
    ckpt's cache key see every budget in force.  Budgets belong to module
    objects: a deep copy of a module keeps them, a pickled one does not.
    """
    if isinstance(budget, Mapping):
        if not isinstance(target, torch.nn.Module):
            raise TypeError(
                "ckpt.set_budget: a mapping of paths needs the module they are relative to, "
                f"got {type(target).__name__}"
            )
        _set_by_path(target, budget)
        return
    modules = _modules_of(target)
    parsed = None if budget is None else parse_budget(budget, "ckpt.set_budget budget")
    for module in modules:
        if parsed is not None and not _has_state(module):
            raise ValueError(
                f"ckpt.set_budget: {type(module).__name__} has no parameters or buffers, so a compiled graph "
                "cannot tell where it runs; give its path from a parent instead, for example "
                "ckpt.set_budget(parent, {'name.of.module': budget})"
            )
    _register([(module, parsed, None) for module in modules])


def clear_budgets(target: Any = None) -> None:
    """Remove the budgets of ``target``'s modules and their submodules (None: every budget)."""
    with _lock:
        if target is None:
            modules = list(_registry.keys())
        else:
            modules = [m for root in _modules_of(target) for m in root.modules() if m in _registry]
        _register([(module, None, None) for module in modules])


def module_budgets() -> list[tuple[torch.nn.Module, Budget]]:
    """The modules with a budget set by :func:`set_budget`, and their budgets."""
    with _lock:
        return [(module, entry.budget) for module, entry in _registry.items()]


def _modules_of(target: Any) -> list[torch.nn.Module]:
    if isinstance(target, _CONTAINERS):  # no forward of their own: each module in them
        return [m for child in target.children() for m in _modules_of(child)]
    if isinstance(target, torch.nn.Module):
        return [target]
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes)):
        items = list(target)
        if items and all(isinstance(item, torch.nn.Module) for item in items):
            return [m for item in items for m in _modules_of(item)]
    raise TypeError(
        f"ckpt.set_budget: target must be a torch.nn.Module or an iterable of them, got {type(target).__name__}"
    )


def _set_by_path(root: torch.nn.Module, mapping: Mapping[Any, Any]) -> None:
    named = dict(root.named_modules(remove_duplicate=False))
    paths = sorted(named)
    entries: list[tuple[torch.nn.Module, Budget | None, tuple[weakref.ref[torch.nn.Module], str] | None]] = []
    for pattern, value in mapping.items():
        validate_module_pattern(pattern, "ckpt.set_budget path")
        parsed = None if value is None else parse_budget(value, f"ckpt.set_budget budget for {pattern!r}")
        matched = [path for path in paths if module_pattern_matches(pattern, path)]
        if not matched:
            close = difflib.get_close_matches(pattern, [p for p in paths if p], n=5, cutoff=0.5)
            hint = f"; closest module paths: {', '.join(close)}" if close else ""
            raise ValueError(f"ckpt.set_budget: path {pattern!r} matches no module of {type(root).__name__}{hint}")
        for path in matched:
            module = named[path]
            if parsed is not None and not _has_state(module) and not _has_state(root):
                raise ValueError(
                    f"ckpt.set_budget: neither {path!r} nor {type(root).__name__} has parameters or buffers, "
                    "so a compiled graph cannot tell where the module runs"
                )
            entries.append((module, parsed, (weakref.ref(root), path)))
    _register(entries)


class _Carrier:
    """Held by a budgeted module: a deep copy of the module gets the same budget."""

    def __init__(self, owner: torch.nn.Module | None, entry: _Entry) -> None:
        self.owner = None if owner is None else weakref.ref(owner)
        self.entry = entry

    def __deepcopy__(self, memo: dict[int, Any]) -> _Carrier:
        # The copy's modules already carry copies of the tags and guard hooks; it only needs registering.
        # (Its state is still being copied, so nothing may walk it here.)
        owner = None if self.owner is None else self.owner()
        copied = memo.get(id(owner)) if owner is not None else None
        if not isinstance(copied, torch.nn.Module):
            return _Carrier(None, self.entry)
        anchor = self.entry.anchor
        if anchor is not None:  # the copy's path resolves from the copy of the root, if it was copied too
            root = memo.get(id(anchor[0]()))
            anchor = (weakref.ref(root), anchor[1]) if isinstance(root, torch.nn.Module) else None
        entry = _Entry(self.entry.budget, self.entry.label, anchor)
        with _lock:
            _registry[copied] = entry
        return _Carrier(copied, entry)

    def __reduce__(self) -> tuple[Any, ...]:  # pickling keeps no budget (there is no owner to find again)
        return (_Carrier, (None, _Entry(self.entry.budget, self.entry.label, None)))


def _register(
    entries: Sequence[tuple[torch.nn.Module, Budget | None, tuple[weakref.ref[torch.nn.Module], str] | None]],
) -> None:
    with _lock:
        touched: list[torch.nn.Module] = []
        for module, budget, anchor in entries:
            if budget is None:
                _registry.pop(module, None)
                module.__dict__.pop(_CARRIER, None)
                touched.extend(module.modules())
            else:
                label = anchor[1] if anchor is not None and anchor[1] else type(module).__name__
                entry = _Entry(budget, label, anchor)
                _registry[module] = entry
                module.__dict__[_CARRIER] = _Carrier(module, entry)
        _retag(touched)


def _budget_guard(module: torch.nn.Module, args: Any) -> None:
    """The forward pre-hook of every module under a budget: it changes nothing.

    Dynamo traces it and guards on the tag it reads, so a graph compiled for
    a module under some budgets runs only for modules under the same budgets.
    """
    if module._ckpt_budget_tag is None:  # never true; the read is what makes Dynamo guard
        return None
    return None


def _retag(touched: Iterable[torch.nn.Module] = ()) -> None:
    """Give every module under a budget its tag and guard hook; take them off the others.

    A module's tag lists the budgets over it with its path under each, so two
    modules get the same tag exactly when the same budgets apply to them and
    to their parts.
    """
    tags: dict[int, list[str]] = {}
    owners: dict[int, torch.nn.Module] = {}
    for module, entry in _registry.items():
        for path, sub in module.named_modules():
            tags.setdefault(id(sub), []).append(f"{entry.budget}@{path}")
            owners[id(sub)] = sub
    for module in [*_tagged, *touched]:
        if id(module) not in tags:
            _untag(module)
    for key, sub in owners.items():
        sub.__dict__[_TAG] = ";".join(sorted(tags[key]))
        if not any(hook is _budget_guard for hook in sub._forward_pre_hooks.values()):
            sub.register_forward_pre_hook(_budget_guard)
        _tagged.add(sub)


def _untag(module: torch.nn.Module) -> None:
    module.__dict__.pop(_TAG, None)
    for key, hook in list(module._forward_pre_hooks.items()):
        if hook is _budget_guard:
            del module._forward_pre_hooks[key]
    _tagged.discard(module)


def module_pattern_matches(pattern: str, path: str) -> bool:
    """Whether a dotted module ``path`` matches ``pattern`` (``*`` stands for one path component)."""
    if pattern == "":
        return path == ""
    regex = r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in pattern.split("."))
    return re.fullmatch(regex, path) is not None


# ---------------------------------------------------------------------------
# Finding the budgeted modules in one compiled frame.


def _relative(path: str) -> str:
    """A frame path without its first component: ``L['self'].layers.0`` -> ``layers.0``."""
    return path.split(".", 1)[1] if "." in path else ""


def _root(path: str) -> str:
    return path.split(".", 1)[0]


def _depth(path: str) -> int:
    return path.count(".") + 1


@dataclass(frozen=True)
class _Frame:
    """What one Dynamo graph tells about its modules."""

    sources: Mapping[int, str]  # id of a graph input tensor -> where Dynamo found it
    classes: Mapping[str, type]  # module path -> class, for the modules whose code the graph runs

    def fits(self, path: str, module: torch.nn.Module) -> bool:
        """Whether ``module`` can be the module at ``path`` (a shared parameter can point elsewhere)."""
        cls = self.classes.get(path)
        return cls is None or issubclass(type(module), cls) or issubclass(cls, type(module))


def _frame_of(gm: fx.GraphModule, example_inputs: Sequence[object]) -> _Frame:
    sources: dict[int, str] = {}
    for value, source in zip(example_inputs, compat.placeholder_sources(gm)):
        if isinstance(value, torch.Tensor) and source is not None:
            sources.setdefault(id(value), source)
    classes: dict[str, type] = {}
    for node in gm.graph.nodes:
        for path, cls in compat.node_module_stack(node):
            classes.setdefault(path, cls)
    return _Frame(sources, classes)


def _place(module: torch.nn.Module, frame: _Frame) -> tuple[str, int] | None:
    """Where ``module`` sits in the frame, from where Dynamo found its tensors: (frame path, depth).

    Inside the frame, the path of the module; for a module that contains the
    frame's own module, the frame's root, with a depth below 1 (less specific
    than anything inside).  A path whose code is another class's (a weight
    shared with another module, found there) does not place it.
    """
    sources = frame.sources
    own = {id(t) for t in itertools.chain(module.parameters(), module.buffers())}
    inside: set[str] = set()
    around: set[tuple[str, int]] = set()
    for name, tensor in itertools.chain(
        module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)
    ):
        source = sources.get(id(tensor))
        if source is None or "." not in source:
            continue
        if source.endswith("." + name):
            inside.add(source[: -len(name) - 1])
        elif name.endswith("." + _relative(source)):
            above = name[: -len(_relative(source)) - 1]  # the path from `module` down to the frame's root
            around.add((_root(source), 1 - _depth(above)))
    # The module at a path owns every tensor the graph found under it; one that does not (a slice of
    # a Sequential, whose names restart at 0) is not that module.
    placed = sorted(
        prefix
        for prefix in inside
        if frame.fits(prefix, module)
        and all(key in own for key, source in sources.items() if source.startswith(prefix + "."))
    )
    if placed:
        if len(placed) > 1:
            log.debug("ckpt: %s found at several paths %s; using the shortest", type(module).__name__, placed)
        best = min(placed, key=lambda p: (len(p), p))
        return best, _depth(best)
    if around:
        return min(around, key=lambda item: (-item[1], item[0]))
    return None


def _place_entry(module: torch.nn.Module, entry: _Entry, frame: _Frame) -> tuple[str, int] | None:
    found = _place(module, frame)
    if found is not None or entry.anchor is None:
        return found
    root = entry.anchor[0]()
    if root is None:
        return None
    parts = entry.anchor[1].split(".") if entry.anchor[1] else []
    for k in range(len(parts) - 1, -1, -1):  # the nearest ancestor the graph can place
        where = _place(root.get_submodule(".".join(parts[:k])), frame)
        if where is not None and where[1] >= 1:
            path = ".".join([where[0], *parts[k:]])
            return path, _depth(path)
    return None


def frame_regions(
    gm: fx.GraphModule, example_inputs: Sequence[object], patterns: Sequence[tuple[str, Budget]]
) -> tuple[RegionSpec, ...]:
    """The budgeted modules of one Dynamo graph, by their path in its frame.

    ``patterns`` are the options' (path pattern, budget) pairs; a module both
    matched by a pattern and given a budget by :func:`set_budget` takes the
    pattern's (options override, as they override environment variables).
    A pattern that matches no module of the graph gets one
    :class:`ModuleBudgetWarning` per process, naming the closest paths.
    """
    with _lock:
        _retag()  # deep copies registered since the last change
        entries = list(_registry.items())
    if not entries and not patterns:
        return ()
    frame = _frame_of(gm, example_inputs)
    specs: dict[str, RegionSpec] = {}
    placed: set[int] = set()
    for module, entry in entries:
        where = _place_entry(module, entry, frame)
        if where is None:
            if any(id(t) in frame.sources for t in itertools.chain(module.parameters(), module.buffers())):
                _warn_once(
                    f"unplaced:{entry.label}",
                    f"ckpt: a compiled graph reads the parameters of the budgeted {entry.label} but cannot tell "
                    "where it runs (its parameters are shared with another module); its budget does not apply "
                    "there. Give it by path instead: ckpt.set_budget(parent, {'name.of.module': budget})",
                )
            continue
        placed.add(id(module))
        path, depth = where
        if path in specs and specs[path].depth >= depth:
            continue
        label = _relative(path) if depth >= 1 else f"{entry.label} (whole graph)"
        specs[path] = RegionSpec(path, entry.budget, label or entry.label, depth)
    _add_running(specs, placed)
    if patterns:
        present = _frame_module_paths(gm, frame.sources.values())
        for pattern, budget in patterns:
            matched = [path for path in present if module_pattern_matches(pattern, _relative(path))]
            if not matched:
                _warn_unmatched(pattern, sorted({_relative(p) for p in present} - {""}))
            for path in matched:
                specs[path] = RegionSpec(path, budget, _relative(path) or type(gm).__name__, _depth(path))
    return tuple(specs[path] for path in sorted(specs))


def _running_modules() -> list[tuple[torch.nn.Module, _Entry]]:
    """Budgeted modules with a method running on the Python stack now, innermost first.

    Dynamo compiles a frame while the code that called it runs: after a graph
    break inside a module's forward, that forward's own frame (``self`` being
    the module) is on the stack while the rest of it is compiled.
    """
    with _lock:
        registry = dict(_registry.items())
    found: list[tuple[torch.nn.Module, _Entry]] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        names = frame.f_code.co_varnames
        if frame.f_code.co_argcount and names:
            first = frame.f_locals.get(names[0])
            if isinstance(first, torch.nn.Module) and first in registry and all(m is not first for m, _ in found):
                found.append((first, registry[first]))
        frame = frame.f_back
    return found


def _add_running(specs: dict[str, RegionSpec], placed: set[int]) -> None:
    """The budget of the innermost budgeted module whose forward runs around this graph, over all of it.

    A graph compiled inside a budgeted module's forward (a part of it after a
    graph break, or a submodule's own frame) computes that module's values,
    even where it holds none of its tensors.
    """
    running = [(module, entry) for module, entry in _running_modules() if id(module) not in placed]
    if not running:
        return
    module, entry = running[0]
    # Placed modules have paths of at least one component, so "" is free; the depth ranks it below them.
    specs[""] = RegionSpec("", entry.budget, f"{entry.label} (whole graph)", -1000)
    name = type(module).__name__
    _warn_once(
        f"reused:{name}",
        f"ckpt: a graph compiled inside a budgeted {name} holds none of its parameters (a part of its forward "
        f"after a graph break), so nothing in it tells one {name} from another: Dynamo reuses it for every "
        f"{name} whose forward reaches it, under the budget of the first ({entry.budget}). "
        f"Give every {name} the same budget, or move the graph break out of it",
    )


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, ModuleBudgetWarning, stacklevel=4)


def _warn_unmatched(pattern: str, present: list[str]) -> None:
    close = difflib.get_close_matches(pattern, present, n=5, cutoff=0.5)
    _warn_once(
        f"path:{pattern}",
        f"ckpt: memory_budget path {pattern!r} matches no module of this compiled graph"
        + (f"; closest module paths: {', '.join(close)}" if close else "")
        + ". Paths are relative to the module torch.compile was given; a graph break inside a submodule, or "
        "inside a loop over submodules, makes Dynamo compile each submodule's forward on its own, where paths "
        "start at the submodule, "
        "so use ckpt.set_budget(model, {path: budget}) to follow modules across graph breaks",
    )


def _frame_module_paths(gm: fx.GraphModule, sources: Iterable[str]) -> list[str]:
    """Every module path the graph runs code of, with their ancestors."""
    paths: set[str] = set()
    for node in gm.graph.nodes:
        path = compat.node_module_path(node)
        if path is not None:
            paths.add(path)
    for source in sources:  # a parameter's path names its module: drop the parameter's own name
        if "." in source:
            paths.add(source.rsplit(".", 1)[0])
    closed: set[str] = set()
    for path in paths:
        parts = path.split(".")
        for k in range(1, len(parts) + 1):
            closed.add(".".join(parts[:k]))
    return sorted(closed)
