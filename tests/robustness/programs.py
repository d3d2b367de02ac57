"""Random DAG-shaped programs for property tests: a plain-data description, a module that runs it, a strategy.

A :class:`Program` is a list of steps over square ``SIZE x SIZE`` float64
values.  Values ``0 .. inputs-1`` are the inputs; step ``i`` makes value
``inputs + i`` from earlier values.  Because every value has the same square
shape, any step can read any earlier value, so the programs are DAGs, not
stacks: fan-out (a value read by several steps), fan-in (two-input steps,
slices concatenated), shared subexpressions (a step repeated verbatim, which
CSE merges), long pointwise chains, reductions broadcast back, views and
transposes, matmuls, and Linear layers for parameters.  The loss sums a
smooth function of every value no step reads, so every value reaches it;
the first step reads the first input, which requires grad.

The ops are smooth where it matters (no comparisons that a rounding
difference could flip), so eager and compiled gradients agree to float64
precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import strategies as st

__all__ = ["Program", "ProgramModule", "budgets", "programs"]

SIZE = 8

UNARY = {
    "sin": torch.sin,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
    "x_tanh_x": lambda x: x * torch.tanh(x),
    "affine": lambda x: 0.5 * x + 0.1,
    "gauss": lambda x: torch.exp(-x * x),
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul_tanh": lambda a, b: a * torch.tanh(b),
    "smooth_max": lambda a, b: torch.logaddexp(a, b),
}
REDUCE = {
    "center": lambda x, d: x - x.mean(d, keepdim=True),
    "softmax": lambda x, d: torch.softmax(x, d),
    "scale_by_sum": lambda x, d: x * torch.tanh(x.sum(d, keepdim=True)),
    "logsumexp": lambda x, d: x - torch.logsumexp(x, d, keepdim=True),
}
VIEW = {
    "t": lambda x: x.t(),
    "flat_roundtrip": lambda x: x.reshape(-1).view(SIZE, SIZE) if x.is_contiguous() else x.reshape(SIZE, SIZE),
    "unsqueeze_squeeze": lambda x: x.unsqueeze(0).squeeze(0),
    "rows_softmax": lambda x: torch.softmax(x.reshape(SIZE // 2, 2 * SIZE), -1).reshape(SIZE, SIZE),
    "expand_row": lambda x: x[1:2].expand(SIZE, SIZE),
}


@dataclass(frozen=True)
class Step:
    """One step: ``kind``, the indices ``args`` of the values it reads, and the names ``ops`` of its ops.

    Kinds: linear (``ops`` names the layer), unary, chain (several unary ops),
    binary, reduce (the dim is the name's last character), view, slice_cat,
    matmul, detach_scale.
    """

    kind: str
    args: tuple[int, ...]
    ops: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(f'v{a}' for a in self.args)}{'; ' + ', '.join(self.ops) if self.ops else ''})"


@dataclass(frozen=True)
class Program:
    inputs: int
    input_requires_grad: tuple[bool, ...]
    steps: tuple[Step, ...]

    @property
    def values(self) -> int:
        return self.inputs + len(self.steps)

    def sinks(self) -> list[int]:
        """Values no step reads (the last one always among them), excluding inputs."""
        read = {a for step in self.steps for a in step.args}
        return [v for v in range(self.inputs, self.values) if v not in read]

    def loss_requires_grad(self) -> bool:
        """Whether the loss reaches a parameter or an input that requires grad (detach cuts the path)."""
        grad = list(self.input_requires_grad)
        for step in self.steps:
            if step.kind == "linear":
                grad.append(True)  # the layer's own parameters
            elif step.kind == "detach_scale":
                grad.append(grad[step.args[0]])
            else:
                grad.append(any(grad[a] for a in step.args))
        return any(grad[v] for v in self.sinks())

    def __str__(self) -> str:
        lines = [f"inputs v0..v{self.inputs - 1} (requires_grad {self.input_requires_grad})"]
        lines += [f"v{self.inputs + i} = {step}" for i, step in enumerate(self.steps)]
        lines.append(f"loss = sum(sin(v).sum() for v in {[f'v{v}' for v in self.sinks()]})")
        return "\n".join(lines)


class ProgramModule(nn.Module):
    """Runs a :class:`Program` in float64; each named ``linear`` step has its own ``nn.Linear``."""

    def __init__(self, program: Program) -> None:
        super().__init__()
        self.program = program
        names = sorted({step.ops[0] for step in program.steps if step.kind == "linear"})
        self.linears = nn.ModuleDict({name: nn.Linear(SIZE, SIZE, dtype=torch.float64) for name in names})

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        values = list(inputs)
        for step in self.program.steps:
            args = [values[a] for a in step.args]
            if step.kind == "linear":
                out = self.linears[step.ops[0]](args[0])
            elif step.kind in ("unary", "chain"):
                out = args[0]
                for name in step.ops:
                    out = UNARY[name](out)
            elif step.kind == "binary":
                out = BINARY[step.ops[0]](args[0], args[1])
            elif step.kind == "reduce":
                name, dim = step.ops[0][:-1], int(step.ops[0][-1])
                out = REDUCE[name](args[0], dim)
            elif step.kind == "view":
                out = VIEW[step.ops[0]](args[0])
            elif step.kind == "slice_cat":
                out = torch.cat([args[0][:, : SIZE // 2], args[1][:, SIZE // 2 :]], dim=1)
            elif step.kind == "matmul":
                out = args[0] @ args[1] / SIZE
            elif step.kind == "detach_scale":
                out = args[0] * torch.tanh(args[1].detach().mean())
            else:
                raise ValueError(f"unknown step kind {step.kind!r}")
            values.append(out)
        loss = values[-1].sin().sum()
        for v in self.program.sinks():
            if v != len(values) - 1:
                loss = loss + values[v].sin().sum()
        return loss


def _step(draw: st.DrawFn, available: int, previous: list[Step]) -> Step:
    if previous and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(previous))  # a shared subexpression
    # Mostly recent values (long chains), sometimes any earlier value (fan-out across the graph).
    pick = st.one_of(st.integers(max(0, available - 3), available - 1), st.integers(0, available - 1))
    kind = draw(
        st.sampled_from(
            ["linear", "unary", "binary", "reduce", "view", "slice_cat", "matmul", "chain", "detach_scale", "linear"]
        )
    )
    if kind in ("binary", "slice_cat", "matmul", "detach_scale"):
        args: tuple[int, ...] = (draw(pick), draw(pick))
    else:
        args = (draw(pick),)
    if not previous:
        # The first step reads v0 (which requires grad) through its differentiable argument; every value
        # reaches the loss, so the loss always has a gradient.
        args = (0, *args[1:])
    ops: tuple[str, ...] = ()
    if kind == "linear":
        ops = (f"linear{len(previous)}",)  # a repeated step reuses its layer
    elif kind == "unary":
        ops = (draw(st.sampled_from(sorted(UNARY))),)
    elif kind == "chain":
        ops = tuple(draw(st.lists(st.sampled_from(sorted(UNARY)), min_size=3, max_size=8)))
    elif kind == "binary":
        ops = (draw(st.sampled_from(sorted(BINARY))),)
    elif kind == "reduce":
        ops = (draw(st.sampled_from(sorted(REDUCE))) + str(draw(st.integers(0, 1))),)
    elif kind == "view":
        ops = (draw(st.sampled_from(sorted(VIEW))),)
    return Step(kind, args, ops)


def programs(min_steps: int = 2, max_steps: int = 14) -> st.SearchStrategy[Program]:
    """Random programs whose loss has a gradient (a backward to partition)."""
    return _programs(min_steps, max_steps).filter(Program.loss_requires_grad)


@st.composite
def _programs(draw: st.DrawFn, min_steps: int, max_steps: int) -> Program:
    inputs = draw(st.integers(1, 2))
    requires_grad = (True,) + tuple(draw(st.booleans()) for _ in range(inputs - 1))
    steps: list[Step] = []
    for _ in range(draw(st.integers(min_steps, max_steps))):
        steps.append(_step(draw, inputs + len(steps), steps))
    return Program(inputs, requires_grad, tuple(steps))


def budgets() -> st.SearchStrategy[str]:
    """``none``, a fraction (the ends included), or an absolute size in bytes."""
    return st.one_of(
        st.just("none"),
        st.sampled_from(["0.0", "1.0"]),
        st.floats(0.0, 1.0).map(lambda f: f"{f:.3f}"),
        st.integers(0, 8 * SIZE * SIZE * 8).map(lambda b: f"{b}B"),
    )


def program_inputs(program: Program, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(SIZE, SIZE, generator=generator, dtype=torch.float64).requires_grad_(flag)
        for flag in program.input_requires_grad
    ]
