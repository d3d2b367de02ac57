"""``python -m benchmarks.replay_allocations``: a step's peak replayed from the code Inductor generated.

``python -m benchmarks.replay_allocations --model gpt2 --setting 0.5``

Compiles a benchmark model (CPU size) under one setting, keeps the Python
wrapper code of its forward and backward graphs, and replays their
allocations line by line:

* ``bufN = empty_strided_cpu(size, stride, dtype)`` allocates its storage;
* ``bufM = bufN; del bufN  # reuse`` (also through ``reinterpret_tensor``)
  hands a storage to a new name, and a plain ``bufM = reinterpret_tensor(bufN,
  ...)`` is a view of it;
* ``del name`` frees a storage once no name refers to it;
* a library call that returns a tuple (attention, convolution's backward)
  allocates each tensor picked out of it (``bufM = bufN[i]``), sized by the
  ``assert_size_stride`` that follows (as float32: the assertion names no
  dtype, so a half-precision model's picked tensors count double);
* a library call without ``out=`` that returns one tensor (a convolution,
  a custom op's copy) allocates it, sized by the ``assert_size_stride`` on
  its own name that follows (as float32 too).

The forward's saved outputs become the backward's inputs and stay alive
until the backward deletes them.  Parameters and the user's inputs are not
counted, as in :func:`ckpt.measure.peak_memory`.  A tuple's tensors are
counted from where they are picked out, and a call's inputs are freed after
it returns, so the replay may be below the measured peak by a call's outputs
and working memory.

The script prints each graph's replayed peak, the line where it happens and
the largest buffers alive there, next to the measured step peak and the peak
model's prediction: the replay tells an error of the model (its order or its
buffers differ from Inductor's) from one of the measurement.  ``--trace
REGEX`` also prints the running total at every backward line that matches.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import re
import sys
from dataclasses import dataclass

import torch

__all__ = ["Replay", "call_body", "main", "replay_step"]

log = logging.getLogger(__name__)

_ITEM_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

_ALLOCATE = re.compile(r"(\w+) = empty_strided_\w+\(\((.*?)\), \((.*?)\), torch\.(\w+)\)")
_REUSE = re.compile(r"(\w+) = (?:reinterpret_tensor\()?(\w+)\b.*; del (\w+)\s+# reuse")
_VIEW = re.compile(r"(\w+) = reinterpret_tensor\((\w+),")
_ALIAS = re.compile(r"(\w+) = (\w+)$")
_DELETE = re.compile(r"del (\w+)$")
_PICK = re.compile(r"(\w+) = (\w+)\[(\d+)\]$")
_SIZE = re.compile(r"assert_size_stride\((\w+), \((.*?)\), \((.*?)\)")
_CALL = re.compile(r"(\w+) = (?:torch\.ops\.|extern_kernels\.)")


@dataclass(frozen=True)
class Replay:
    """One graph's replayed allocations: its peak, where, what was alive there, and what it ends with."""

    peak_bytes: int
    line: str  # the wrapper line at which the peak is first reached
    alive: tuple[tuple[str, int], ...]  # buffers alive there, largest first (named as first allocated)
    end_bytes: int  # alive when the graph returns (before its locals go)


def _storage_bytes(size: str, stride: str, dtype: str) -> int:
    """Bytes of a storage that holds a tensor of ``size`` and ``stride`` (the wrapper's tuple literals)."""
    if dtype not in _ITEM_BYTES:
        raise ValueError(f"replay: dtype torch.{dtype} has no known size; known: {sorted(_ITEM_BYTES)}")
    size, stride = size.strip().rstrip(","), stride.strip().rstrip(",")  # "(13, )" is a 1-d size
    shape = ast.literal_eval(f"({size},)") if size else ()
    strides = ast.literal_eval(f"({stride},)") if stride else ()
    if any(s == 0 for s in shape):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(shape, strides))) * _ITEM_BYTES[dtype]


def call_body(code: str) -> list[str]:
    """The stripped lines of the wrapper's ``call`` function in ``code`` (Inductor's output code)."""
    lines = code.split("\n")
    start = next(
        (i for i, line in enumerate(lines) if re.match(r"\s*def call\((self, )?args\)", line)),
        None,
    )
    if start is None:
        raise ValueError("replay: no `def call(args)` in the code; is it Inductor's Python wrapper code?")
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        if line.strip():
            body.append(line.strip())
    return body


class _Allocations:
    """Names to storages, storages to bytes, and the running total with its peak."""

    def __init__(self) -> None:
        self.storage: dict[str, int] = {}  # name -> storage id
        self.nbytes: dict[int, int] = {}
        self.label: dict[int, str] = {}  # storage id -> the name it was allocated under
        self.total = 0
        self.peak = 0
        self.peak_line = ""
        self.peak_alive: tuple[tuple[str, int], ...] = ()
        self.call_results: set[str] = set()  # names bound to a library call's result (a tuple, or a tensor)
        self.picked: set[str] = set()  # tensors picked out of a tuple, sized by the next size assertion
        self._next = 0

    def replay(self) -> Replay:
        return Replay(self.peak, self.peak_line, self.peak_alive, self.total)

    def alive(self) -> tuple[tuple[str, int], ...]:
        ids = set(self.storage.values())
        return tuple(sorted(((self.label[s], self.nbytes[s]) for s in ids if self.nbytes[s]), key=lambda a: -a[1]))

    def allocate(self, name: str, nbytes: int, line: str) -> None:
        self.drop(name)
        sid, self._next = self._next, self._next + 1
        self.storage[name], self.nbytes[sid], self.label[sid] = sid, nbytes, name
        self.total += nbytes
        if self.total > self.peak:
            self.peak, self.peak_line, self.peak_alive = self.total, line, self.alive()

    def drop(self, name: str) -> None:
        sid = self.storage.pop(name, None)
        if sid is not None and sid not in self.storage.values():
            self.total -= self.nbytes[sid]

    def run(self, lines: list[str], trace: re.Pattern[str] | None = None) -> None:
        for line in lines:
            if trace is not None and trace.search(line):
                sys.stdout.write(f"{self.total / 2**20:9.2f} MiB  {line[:100]}\n")
            if match := _ALLOCATE.match(line):
                self.allocate(match[1], _storage_bytes(match[2], match[3], match[4]), line)
            elif match := _REUSE.match(line):
                if match[3] in self.storage:
                    self.storage[match[1]] = self.storage.pop(match[3])
            elif (match := _VIEW.match(line) or _ALIAS.match(line)) and match[2] in self.storage:
                self.storage[match[1]] = self.storage[match[2]]
            elif match := _DELETE.match(line):
                self.drop(match[1])
            elif (match := _PICK.match(line)) and match[2] in self.call_results:
                self.picked.add(match[1])
            elif (match := _SIZE.match(line)) and (match[1] in self.picked or match[1] in self.call_results):
                # a tensor picked out of a call's tuple, or a call's own tensor result
                self.picked.discard(match[1])
                self.call_results.discard(match[1])
                self.allocate(match[1], _storage_bytes(match[2], match[3], "float32"), line)
            elif (match := _CALL.match(line)) and "out=" not in line:
                self.call_results.add(match[1])


def _returned(body: list[str]) -> list[str]:
    """The names a ``call`` body returns, in order (``None`` entries dropped, views named by their base)."""
    line = next((line for line in body if line.startswith("return (")), None)
    if line is None:
        raise ValueError("replay: the forward's `call` has no `return (...)` line")
    names = []
    for element in ast.parse(line[len("return ") :], mode="eval").body.elts:  # type: ignore[attr-defined]
        if isinstance(element, ast.Call) and element.args:  # reinterpret_tensor(buf, ...): a view of buf
            element = element.args[0]
        if isinstance(element, ast.Name):
            names.append(element.id)
    return names


def replay_step(
    forward_code: str, backward_code: str, num_fwd_outputs: int = 1, trace: re.Pattern[str] | None = None
) -> tuple[Replay, Replay]:
    """Replay a training step: the forward, then the backward with the forward's saved outputs as its inputs.

    Both peaks count from before the forward: the backward's includes what
    the forward left for it (``num_fwd_outputs`` outputs go to the user, the
    rest are saved).
    """
    forward_body, backward_body = call_body(forward_code), call_body(backward_code)
    state = _Allocations()
    state.run([line for line in forward_body if not line.startswith("return (")])
    forward = state.replay()
    returned = _returned(forward_body)
    kept = set(returned)
    for name in list(state.storage):
        if name not in kept:
            state.drop(name)
    unpack = next((line for line in backward_body if line.endswith("= args")), None)
    if unpack is None:
        raise ValueError("replay: the backward's `call` does not unpack `args`")
    arguments = [a.strip() for a in unpack[: -len("= args")].split(",") if a.strip()]
    as_argument = dict(zip(returned[num_fwd_outputs:], arguments))  # saved output -> its name in the backward
    renamed = {}
    for name, sid in state.storage.items():
        renamed[as_argument.get(name, name)] = sid
        state.label[sid] = as_argument.get(name, name)
    state.storage = renamed
    state.peak, state.peak_line, state.peak_alive = state.total, "(backward start)", state.alive()
    state.run(backward_body, trace)
    return forward, state.replay()


def main(argv: list[str] | None = None) -> int:
    from benchmarks.models import MODELS, model_spec
    from benchmarks.peak_accuracy import compile_options
    from ckpt import _torch_compat as compat
    from ckpt.measure import peak_memory
    from ckpt.records import record_partitions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--setting", default="0.5", help="a budget (none, 0.5, 2GiB), or peak-<cap> for a peak cap")
    parser.add_argument("--size", default="cpu", choices=("tiny", "cpu"))
    parser.add_argument("--trace", help="print the running total at every backward line matching this regex")
    parser.add_argument("--top", type=int, default=12, help="largest buffers alive at each peak to print")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))

    torch.manual_seed(0)
    model = model_spec(args.model).build(args.size)
    inputs = model.make_inputs(torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)
    torch.compiler.reset()
    step = torch.compile(lambda *a: model(*a), backend="ckpt", options=compile_options(args.setting))

    def run() -> None:
        step(*inputs).backward()

    with compat.compile_caches_disabled(), record_partitions() as records:
        _, code = compat.run_and_get_code(run)
    if len(code) != 2:
        raise SystemExit(f"replay: expected one forward and one backward graph, got {len(code)} code modules")
    model.zero_grad(set_to_none=True)
    measured = peak_memory(run)
    trace = re.compile(args.trace) if args.trace else None
    forward, backward = replay_step(code[0], code[1], trace=trace)
    predicted = next((r.peak for r in records if r.peak is not None), None)
    out = sys.stdout
    out.write(f"{args.model} {args.setting}: measured step peak {measured.mib:.2f} MiB")
    if predicted is not None:
        out.write(f", predicted {predicted.peak_bytes / 2**20:.2f} MiB ({predicted.phase} at {predicted.node})")
    out.write("\n")
    for phase, replay in (("forward", forward), ("backward", backward)):
        out.write(f"replayed {phase} peak {replay.peak_bytes / 2**20:.2f} MiB at: {replay.line[:110]}\n")
        for name, nbytes in replay.alive[: args.top]:
            out.write(f"    {nbytes / 2**20:8.3f} MiB  {name}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
