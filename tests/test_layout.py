"""The package's layout rules, read from the source: imports point one way, solvers stay plain data.

``cost_model -> partitioner -> backend -> tools``: a lower layer never imports a
higher one (at module level or inside a function), there is no import cycle,
and the solvers never touch torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "ckpt"

# Lower number = lower layer. A module may import its own layer or lower ones.
LAYERS = {
    "ckpt._torch_compat": 0,
    "ckpt._version": 0,
    "ckpt.config": 1,  # reads the device profiles' names; the calibration reads its cache directory
    "ckpt.cost_model": 1,
    "ckpt.partitioner": 2,
    "ckpt.records": 3,
    "ckpt.measure": 3,
    "ckpt.module_budgets": 3,  # set_budget's registry, read by the backend
    "ckpt.backend": 4,
    "ckpt.aot_partition": 4,  # the backend's partitioner, for AOTAutograd's own callers
    "ckpt.tools": 5,
    "ckpt.__main__": 6,
    "ckpt": 6,  # the package's __init__
}
PLAIN_DATA = [
    "problem",
    "plan",
    "solver",
    "min_cut",
    "maxflow",
    "repair",
    "exhaustive",
    "peak",
    "peak_order",
    "peak_search",
    "segments",
    "regional",
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), key=len)
    return LAYERS[best]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module != "ckpt":  # `from ckpt import x` depends on ckpt.x, not on the package's __init__
                names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


MODULES = {_module_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


def _ckpt_imports(module: str) -> set[str]:
    """The ckpt modules ``module`` imports (``from ckpt.x import y`` counts ckpt.x.y only if it is a module)."""
    return {name for name in MODULES[module] if name in MODULES and name != module}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    upward = sorted(name for name in _ckpt_imports(module) if _layer(name) > _layer(module))
    assert not upward, f"{module} (layer {_layer(module)}) imports higher layers: {upward}"


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for name in sorted(_ckpt_imports(module)):
            if state.get(name) == 1:
                cycle = path[path.index(name) :] + [name] if name in path else [module, name]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if name not in state:
                visit(name, [*path, name])
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state and module != "ckpt":  # __init__ is the top, by design
            visit(module, [module])


@pytest.mark.parametrize("name", PLAIN_DATA)
def test_solvers_never_touch_torch(name):
    imported = MODULES[f"ckpt.partitioner.{name}"]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")], imported
