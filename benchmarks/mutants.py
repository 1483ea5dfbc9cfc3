"""Mutants of an op's ``torch`` implementation: a small AST mutator (benchmarks/mutation_catch.py).

The code mutated is the implementation and every project function it reaches (module-level
functions of ``suites`` and ``reference_kernels`` that it calls, transitively), since most
``torch`` implementations are one-line wrappers. A mutant changes one site of one function.
While a mutant runs, the mutated function replaces the original in every project module that
binds it, and only for the length of the call: the reference, the goldens and every other
implementation run the unmutated code.

Families (the bugs a kernel writer makes):

- ``operator``: ``+``/``-``, ``*``/``/``, ``//`` to ``/``, ``&``/``|``; ``and``/``or``
- ``compare``: ``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``
- ``drop_term``: ``a + b`` to ``a`` or ``b``, ``a * b`` to ``a``; a statement removed;
  a unary ``-``, ``~`` or ``not`` removed
- ``off_by_one``: integer constants and slice bounds +-1 (a missing bound becomes 1 or -1)
- ``swap_args``: two adjacent positional arguments of a call swapped
- ``dtype``: float64 to float32, float32 to bfloat16, int64 to int32, ``.float()`` to
  ``.bfloat16()``, ``.double()`` to ``.float()``, ``.long()`` to ``.int()``
- ``ties``: ``stable``/``descending``/``largest``/``keepdim`` flags flipped (any boolean
  constant), ``argmax``/``argmin``, ``max``/``min``, ``amax``/``amin``, ``maximum``/``minimum``,
  ``clamp_min``/``clamp_max`` swapped
- ``mask``: ``torch.where(m, a, b)`` to ``torch.where(m, b, a)`` is a swap_args; a float
  constant set to 0 (an epsilon, a clamp floor, a fill value) or 1 if it was 0

Kernel families (the bugs of tiled, padded, mixed-precision kernels; each reaches a helper of
this module through ``__import__("mutants")``):

- ``padded_block``: a mean, softmax or rms_norm over the dimension padded to the next power of
  two (divided by the padded block; zeros in the softmax's padding)
- ``extra_rounding``: a float32 matmul or sum rounded to bf16 and back, then used
- ``narrow_output``: a returned float32 tensor computed through bf16; a 16-bit one through the
  other 16-bit type (bf16 <-> fp16: range or mantissa lost)
- ``tail_mask``: the bound of a ``<``, ``<=``, ``>``, ``>=`` against a non-constant one less
- ``drop_last``: ``range(n)`` to ``range(n - 1)``; the last piece left out of ``torch.cat`` or
  ``torch.stack``

Not mutated: docstrings, annotations, ``raise`` and ``assert`` statements (argument
validation), keyword-only switches that plant a negative control's bug (``*, bug=False``,
``*, bug: str = ""``) and the branch they take only when set (and what only it calls);
argument swaps of symmetric calls (``transpose(0, 1)``) and swaps of two equal arguments,
which change nothing.
"""

from __future__ import annotations

import ast
import collections
import copy
import importlib
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PROJECT_PACKAGES = ("suites", "reference_kernels")

BINOP_SWAPS: dict[type, list[type]] = {
    ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult],
    ast.FloorDiv: [ast.Div], ast.Mod: [ast.FloorDiv], ast.Pow: [ast.Mult],
    ast.BitAnd: [ast.BitOr], ast.BitOr: [ast.BitAnd], ast.LShift: [ast.RShift],
    ast.RShift: [ast.LShift],
}
COMPARE_SWAPS: dict[type, list[type]] = {
    ast.Lt: [ast.LtE], ast.LtE: [ast.Lt], ast.Gt: [ast.GtE], ast.GtE: [ast.Gt],
    ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.Is: [ast.IsNot], ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn], ast.NotIn: [ast.In],
}
NAME_SWAPS = {
    "argmax": "argmin", "argmin": "argmax", "max": "min", "min": "max", "amax": "amin",
    "amin": "amax", "maximum": "minimum", "minimum": "maximum", "clamp_min": "clamp_max",
    "clamp_max": "clamp_min",
}
DTYPE_NARROWING = {
    "float64": "float32", "double": "float32", "float32": "bfloat16", "float": "bfloat16",
    "int64": "int32", "long": "int32",
}
SYMMETRIC_CALLS = {"transpose", "swapaxes", "swapdims", "maximum", "minimum", "eq", "ne",
                   "mul", "add"}
METHOD_NARROWING = {"float": "bfloat16", "double": "float", "long": "int"}


@dataclass(frozen=True)
class Mutant:
    """One change at one site of one function."""

    module: str
    function: str
    #: line within the function's source (1 = the ``def`` line) and column
    line: int
    col: int
    family: str
    description: str
    source: str  # the whole mutated function, dedented

    @property
    def key(self) -> str:
        """Stable name: unchanged while the function's own text is unchanged."""
        return (f"{self.module}:{self.function}:{self.line}:{self.col}:"
                f"{self.family}:{self.description}")


def project_functions(root: Callable[..., Any]) -> list[types.FunctionType]:
    """``root`` and the module-level project functions it calls, transitively, in a stable
    order (breadth first, then by name)."""
    seen: dict[tuple[str, str], types.FunctionType] = {}
    queue = [inspect.unwrap(root)]
    while queue:
        fn = queue.pop(0)
        if not isinstance(fn, types.FunctionType) or not _is_project(fn):
            continue
        key = (fn.__module__, fn.__qualname__)
        if key in seen or "<locals>" in fn.__qualname__:
            continue
        seen[key] = fn
        queue.extend(sorted(_callees(fn), key=lambda f: (f.__module__, f.__qualname__)))
    return list(seen.values())


def _is_project(fn: types.FunctionType) -> bool:
    return fn.__module__.split(".")[0] in PROJECT_PACKAGES


def _callees(fn: types.FunctionType) -> Iterator[types.FunctionType]:
    """Functions named by ``f(...)`` or ``module.f(...)`` calls in ``fn``'s body, outside the
    branches only a negative control's switch reaches."""
    tree = _parse(fn)
    dead = _dead_nodes(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in dead:
            continue
        target: Any = None
        if isinstance(node.func, ast.Name):
            target = fn.__globals__.get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            owner = fn.__globals__.get(node.func.value.id)
            if isinstance(owner, types.ModuleType):
                target = getattr(owner, node.func.attr, None)
        if isinstance(target, types.FunctionType):
            yield inspect.unwrap(target)


def _parse(fn: types.FunctionType) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef), fn
    return node


def mutants_of(fn: types.FunctionType) -> list[Mutant]:
    """Every single-site mutant of ``fn``."""
    tree = _parse(fn)
    tree.decorator_list = []  # the decorated original is what callers hold; keep it plain
    original = ast.unparse(tree)
    out: list[Mutant] = []
    seen: collections.Counter[str] = collections.Counter()
    for site, family, desc, apply in _sites(tree):
        mutated = copy.deepcopy(tree)
        target = _node_at(mutated, site)
        apply(target)
        ast.fix_missing_locations(mutated)
        try:
            src = ast.unparse(mutated)
            compile(src, "<mutant>", "exec")
        except (SyntaxError, ValueError):
            continue
        if src == original:  # swapping two equal arguments
            continue
        seen[f"{site.lineno}:{site.col_offset}:{desc}"] += 1
        n = seen[f"{site.lineno}:{site.col_offset}:{desc}"]
        # two sites can share a place (a slice and its bound): number the second
        out.append(Mutant(fn.__module__, fn.__qualname__, site.lineno, site.col_offset,
                          family, desc if n == 1 else f"{desc} #{n}", src))
    return out


def unparsed_original(module: str, function: str) -> str:
    """The function's source as the mutants are written (unparsed, no decorators)."""
    tree = _parse(inspect.unwrap(getattr(importlib.import_module(module), function)))
    tree.decorator_list = []
    return ast.unparse(tree)


def _node_at(tree: ast.AST, site: ast.AST) -> ast.AST:
    """The node of a deep copy that is the copy of ``site`` (deepcopy keeps the walk index
    that _sites numbered the original's nodes with)."""
    index = site._walk_index  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if getattr(node, "_walk_index", None) == index:
            return node
    raise AssertionError("site not found")


def _sites(tree: ast.FunctionDef) -> Iterator[tuple[ast.AST, str, str, Callable[[Any], None]]]:
    """(node, family, description, function applying the change to that node's copy)."""
    skip = _skipped_nodes(tree)
    for i, node in enumerate(ast.walk(tree)):
        node._walk_index = i  # type: ignore[attr-defined]
        for child in ast.iter_child_nodes(node):
            child._parent = node  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        yield from _node_sites(node)
        yield from _kernel_sites(node, ast.unparse(node))


def _dead_nodes(tree: ast.FunctionDef) -> set[int]:
    """ids of the nodes only a negative control's switch reaches: the branch of an ``if`` on
    a keyword-only switch (``*, bug=False``, ``*, bug: str = ""``) that its default does not
    take."""
    args = tree.args
    switches = {a.arg: d.value for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if isinstance(d, ast.Constant) and isinstance(d.value, (bool, str))}
    dead: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp):
            # `x and switch` is False at the default whatever x is: x is dead there too
            decided = [_switch_default(v, switches) for v in node.values]
            value = False if isinstance(node.op, ast.And) else True
            if value in decided:
                dead.update(id(x) for v in node.values for x in ast.walk(v))
            continue
        if isinstance(node, (ast.If, ast.IfExp)):
            taken = _switch_default(node.test, switches)
            if taken is None:
                continue
            dead.update(id(x) for x in ast.walk(node.test))
            branch = node.orelse if taken else node.body
            for part in branch if isinstance(branch, list) else [branch]:
                dead.update(id(x) for x in ast.walk(part))
        for block in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(block, list):
                dead.update(_after_early_return(block, switches))
    return dead


def _after_early_return(block: list[ast.stmt], switches: dict[str, Any]) -> set[int]:
    """ids of the statements after ``if switch: return ...`` when the default takes it."""
    for i, stmt in enumerate(block):
        if (isinstance(stmt, ast.If) and not stmt.orelse and stmt.body
                and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
                and _switch_default(stmt.test, switches)):
            return {id(x) for rest in block[i + 1:] for x in ast.walk(rest)}
    return set()


def _skipped_nodes(tree: ast.FunctionDef) -> set[int]:
    """ids of nodes that are not mutated (see the module docstring)."""
    skip: set[int] = _dead_nodes(tree)

    def drop(n: ast.AST | None) -> None:
        if n is not None:
            skip.update(id(x) for x in ast.walk(n))

    args = tree.args
    for a in args.posonlyargs + args.args + args.kwonlyargs:
        drop(a.annotation)
    drop(args.vararg.annotation if args.vararg else None)
    drop(args.kwarg.annotation if args.kwarg else None)
    drop(tree.returns)
    for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
        drop(d)
    switches = {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if isinstance(d, ast.Constant) and isinstance(d.value, (bool, str))}
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        drop(body[0])
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr)):
            drop(node)
        elif isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            drop(node)
        elif isinstance(node, ast.keyword) and node.arg in switches:
            drop(node)
    return skip


def _switch_default(test: ast.AST, switches: dict[str, Any]) -> bool | None:
    """The truth of ``test`` with every switch at its default, when ``test`` is built from
    switches, constants, ``not``, ``==``/``!=``, ``and``/``or``; None otherwise."""
    if isinstance(test, ast.Name):
        return bool(switches[test.id]) if test.id in switches else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _switch_default(test.operand, switches)
        return None if inner is None else not inner
    if (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
            and isinstance(test.left, ast.Name) and test.left.id in switches
            and isinstance(test.comparators[0], ast.Constant)):
        equal = switches[test.left.id] == test.comparators[0].value
        return equal if isinstance(test.ops[0], ast.Eq) else not equal
    if isinstance(test, ast.BoolOp):
        parts = [_switch_default(v, switches) for v in test.values]
        decisive = False if isinstance(test.op, ast.And) else True
        if decisive in parts:
            return decisive
        return None if None in parts else not decisive
    return None


def _node_sites(node: ast.AST) -> Iterator[tuple[ast.AST, str, str, Callable[[Any], None]]]:
    if isinstance(node, ast.BinOp):
        for new in BINOP_SWAPS.get(type(node.op), []):
            yield node, "operator", f"{_op(node.op)}->{_op(new())}", _set_op(new)
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            yield node, "drop_term", "keep left", _replace_with("left")
            if not isinstance(node.op, ast.Sub):
                yield node, "drop_term", "keep right", _replace_with("right")
    elif isinstance(node, ast.AugAssign):
        for new in BINOP_SWAPS.get(type(node.op), []):
            yield node, "operator", f"{_op(node.op)}=->{_op(new())}=", _set_op(new)
    elif isinstance(node, ast.BoolOp):
        new_op = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield node, "operator", f"{_op(node.op)}->{_op(new_op())}", _set_op(new_op)
    elif isinstance(node, ast.Compare):
        for j, op in enumerate(node.ops):
            for new in COMPARE_SWAPS.get(type(op), []):
                yield node, "compare", f"{_op(op)}->{_op(new())}", _set_cmp(j, new)
    elif (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert, ast.Not))
          and not isinstance(node.operand, ast.Constant)):  # -1: the constant's own +-1 cover it
        yield node, "drop_term", f"drop unary {_op(node.op)}", _replace_with("operand")
    elif isinstance(node, ast.Constant):
        yield from _constant_sites(node)
    elif isinstance(node, ast.Slice):
        for part in ("lower", "upper"):
            for delta in (1, -1):
                yield node, "off_by_one", f"slice {part}{delta:+d}", _shift_bound(part, delta)
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name):
        for delta in (1, -1):
            yield node, "off_by_one", f"index{delta:+d}", _shift_index(delta)
    elif isinstance(node, ast.Call):
        yield from _call_sites(node)
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        if (node.attr in DTYPE_NARROWING and isinstance(node.value, ast.Name)
                and node.value.id == "torch"):
            new_attr = DTYPE_NARROWING[node.attr]
            yield node, "dtype", f"torch.{node.attr}->torch.{new_attr}", _set_attr(new_attr)
    elif isinstance(node, (ast.Expr, ast.AugAssign, ast.Assign)) and _is_effect(node):
        yield node, "drop_term", "drop statement", _make_pass


PADDED_CALLS = {"mean": "k_mean_padded", "softmax": "k_softmax_padded",
                "rms_norm": "k_rms_norm_padded"}
ROUNDED_CALLS = {"matmul", "mm", "bmm", "linear", "addmm", "einsum", "sum"}


def _helper(name: str) -> ast.expr:
    return ast.Attribute(value=ast.Call(func=ast.Name(id="__import__", ctx=ast.Load()),
                                        args=[ast.Constant(value="mutants")], keywords=[]),
                         attr=name, ctx=ast.Load())


def _wrap(helper: str) -> Callable[[Any], None]:
    """Turn the node (an expression) into ``helper(node)`` in place."""
    def apply(n: Any) -> None:
        inner = copy.copy(n)
        n.__class__ = ast.Call
        n.func, n.args, n.keywords = _helper(helper), [inner], []
    return apply


def _padded(helper: str) -> Callable[[Any], None]:
    """``x.mean(...)`` / ``torch.mean(x, ...)`` to ``helper(x, ...)``."""
    def apply(n: Any) -> None:
        func = n.func
        is_method = (isinstance(func, ast.Attribute) and not (
            isinstance(func.value, ast.Name) and func.value.id in ("torch", "F")))
        if is_method:
            n.args = [func.value, *n.args]
        n.func = _helper(helper)
    return apply


def _kernel_sites(node: ast.AST, text: str) -> Iterator[tuple[ast.AST, str, str, Callable]]:
    """The kernel families' sites at ``node`` (``text``: its source)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else (
            func.id if isinstance(func, ast.Name) else None)
        if name in PADDED_CALLS:
            yield node, "padded_block", f"{name} over a power-of-two block", \
                _padded(PADDED_CALLS[name])
        if name in ROUNDED_CALLS and "float" in text and not _cast_next(node):
            yield node, "extra_rounding", f"{name} rounded to bf16", _wrap("k_round_bf16")
        if name == "range" and 1 <= len(node.args) <= 2 and not isinstance(node.args[-1],
                                                                           ast.Constant):
            yield node, "drop_last", "range(..., n - 1)", _shrink_last_arg
        if name in ("cat", "stack") and node.args and not isinstance(node.args[0], ast.Starred):
            yield node, "drop_last", f"{name} without its last piece", _drop_last_piece
    elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and "float" in text
          and not _cast_next(node)):
        yield node, "extra_rounding", "@ rounded to bf16", _wrap("k_round_bf16")
    elif isinstance(node, ast.Return) and node.value is not None:
        yield node, "narrow_output", "output through a narrower type", _narrow_return
    elif (isinstance(node, ast.Compare) and len(node.ops) == 1
          and isinstance(node.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE))
          and not isinstance(node.comparators[0], ast.Constant)):
        yield node, "tail_mask", f"{_op(node.ops[0])} bound - 1", _shrink_bound


def _cast_next(node: ast.AST) -> bool:
    """Whether ``node`` is cast right away (``node.to(...)``): a bf16 rounding there is the
    output's own, and rounding twice to the same type rounds once."""
    parent = getattr(node, "_parent", None)
    return isinstance(parent, ast.Attribute) and parent.attr == "to"


def _one_less(e: ast.expr) -> ast.expr:
    return ast.BinOp(left=e, op=ast.Sub(), right=ast.Constant(value=1))


def _shrink_last_arg(n: Any) -> None:
    n.args[-1] = _one_less(n.args[-1])


def _shrink_bound(n: Any) -> None:
    n.comparators[0] = _one_less(n.comparators[0])


def _drop_last_piece(n: Any) -> None:
    n.args[0] = ast.Subscript(value=n.args[0], slice=ast.Slice(upper=ast.Constant(value=-1)),
                              ctx=ast.Load())


def _narrow_return(n: Any) -> None:
    n.value = ast.Call(func=_helper("k_narrow"), args=[n.value], keywords=[])


# the kernel families' helpers, called from mutated code -------------------------------------

def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _dims(x: Any, dim: Any) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.dim()))
    return tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)


def k_mean_padded(x: Any, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
    """The mean over ``dim`` divided by the padded block, not the length."""
    n = 1
    for d in _dims(x, dim):
        n *= x.shape[d]
    return x.sum(dim=dim, keepdim=keepdim, **kw) / _next_pow2(n) if dim is not None else \
        x.sum(**kw) / _next_pow2(n)


def k_softmax_padded(x: Any, dim: int = -1, *args: Any, **kw: Any) -> Any:
    """softmax over ``dim`` padded with zeros (not -inf) up to a power of two."""
    import torch

    pad = _next_pow2(x.shape[dim]) - x.shape[dim]
    if pad == 0:
        return torch.softmax(x, dim, *args, **kw)
    shape = list(x.shape)
    shape[dim] = pad
    full = torch.cat([x, torch.zeros(shape, dtype=x.dtype, device=x.device)], dim=dim)
    return torch.softmax(full, dim, *args, **kw).narrow(dim, 0, x.shape[dim])


def k_rms_norm_padded(x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
    """rms_norm whose mean square is divided by the padded block."""
    import torch

    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    ms = k_mean_padded(x.float().pow(2), dims, keepdim=True)
    y = x.float() * torch.rsqrt(ms + (eps if eps is not None else torch.finfo(x.dtype).eps))
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def k_round_bf16(t: Any) -> Any:
    """A float32/64 tensor rounded to bf16 and back (other values as they are)."""
    import torch

    if isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float64):
        return t.to(torch.bfloat16).to(t.dtype)
    return t


def k_narrow(value: Any) -> Any:
    """Every float tensor in ``value`` through a narrower type: float32/64 through bf16, bf16
    through fp16 and fp16 through bf16, back to its own dtype."""
    import torch

    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        via = {torch.float32: torch.bfloat16, torch.float64: torch.bfloat16,
               torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}.get(value.dtype)
        return value if via is None else value.to(via).to(value.dtype)
    if isinstance(value, tuple):
        return tuple(k_narrow(v) for v in value)
    if isinstance(value, list):
        return [k_narrow(v) for v in value]
    if isinstance(value, dict):
        return {k: k_narrow(v) for k, v in value.items()}
    return value


def _constant_sites(node: ast.Constant) -> Iterator[tuple[ast.AST, str, str, Callable]]:
    v = node.value
    if isinstance(v, bool):
        yield node, "ties", f"{v}->{not v}", _set_value(not v)
    elif isinstance(v, int):
        for delta in (1, -1):
            yield node, "off_by_one", f"{v}->{v + delta}", _set_value(v + delta)
    elif isinstance(v, float):
        new = 1.0 if v == 0 else 0.0
        yield node, "mask", f"{v!r}->{new!r}", _set_value(new)


def _call_sites(node: ast.Call) -> Iterator[tuple[ast.AST, str, str, Callable]]:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else None)
    if name in NAME_SWAPS:
        yield node, "ties", f"{name}->{NAME_SWAPS[name]}", _rename_call(NAME_SWAPS[name])
    if (isinstance(func, ast.Attribute) and name in METHOD_NARROWING and not node.args
            and not node.keywords):
        yield node, "dtype", f".{name}()->.{METHOD_NARROWING[name]}()", \
            _rename_call(METHOD_NARROWING[name])
    positional = [a for a in node.args if not isinstance(a, ast.Starred)]
    # transpose(0, 1) is transpose(1, 0): swapping a symmetric call's arguments changes nothing
    if len(positional) == len(node.args) and name not in SYMMETRIC_CALLS:
        for j in range(len(node.args) - 1):
            yield node, "swap_args", f"swap args {j},{j + 1}", _swap(j)


def _is_effect(node: ast.stmt) -> bool:
    """A statement whose removal changes state, not a value's definition: a call for its
    effect, an augmented assignment, a store into a subscript or attribute."""
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Call)
    if isinstance(node, ast.AugAssign):
        return True
    return all(isinstance(t, (ast.Subscript, ast.Attribute)) for t in node.targets)


def _op(op: ast.AST) -> str:
    names = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
             ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<",
             ast.RShift: ">>", ast.And: "and", ast.Or: "or", ast.Lt: "<", ast.LtE: "<=",
             ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
             ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.USub: "-",
             ast.Invert: "~", ast.Not: "not"}
    return names.get(type(op), type(op).__name__)


# appliers: each changes the copied node in place ---------------------------------------------

def _set_op(new: type) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        n.op = new()
    return apply


def _set_cmp(j: int, new: type) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        n.ops[j] = new()
    return apply


def _set_value(v: Any) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        n.value = v
    return apply


def _set_attr(attr: str) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        n.attr = attr
    return apply


def _replace_with(field_name: str) -> Callable[[Any], None]:
    """Turn the node into its child ``field_name`` (copying the child's class and fields)."""
    def apply(n: Any) -> None:
        child = getattr(n, field_name)
        n.__class__ = child.__class__
        n.__dict__.clear()
        n.__dict__.update(child.__dict__)
    return apply


def _make_pass(n: Any) -> None:
    n.__class__ = ast.Pass
    lineno, col = n.lineno, n.col_offset
    n.__dict__.clear()
    n.lineno, n.col_offset = lineno, col


def _shift_bound(part: str, delta: int) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        bound = getattr(n, part)
        if bound is None:
            setattr(n, part, ast.Constant(delta))
        else:
            setattr(n, part, ast.BinOp(bound, ast.Add(), ast.Constant(delta)))
    return apply


def _shift_index(delta: int) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        n.slice = ast.BinOp(n.slice, ast.Add(), ast.Constant(delta))
    return apply


def _rename_call(name: str) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        if isinstance(n.func, ast.Attribute):
            n.func.attr = name
        else:
            n.func.id = name
    return apply


def _swap(j: int) -> Callable[[Any], None]:
    def apply(n: Any) -> None:
        n.args[j], n.args[j + 1] = n.args[j + 1], n.args[j]
    return apply


# running a mutant ---------------------------------------------------------------------------

def mutant_callable(impl: Callable[..., Any], module: str, function: str, source: str
                    ) -> Callable[..., Any]:
    """``impl``, with ``module.function`` replaced by the function ``source`` defines while
    each call runs (in every project module that binds the original)."""
    mod = importlib.import_module(module)
    original = getattr(mod, function)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<mutant of {module}.{function}>", "exec"), mod.__dict__, namespace)
    replacement = namespace[function]
    unwrapped = inspect.unwrap(original)

    found: list[tuple[types.ModuleType, str]] | None = None

    def bindings() -> list[tuple[types.ModuleType, str]]:
        """Every project module attribute bound to the original, looked up at the first call
        (when every module the implementation uses is imported) and kept."""
        nonlocal found
        if found is None:
            found = [(m, attr) for m in list(sys.modules.values())
                     if (getattr(m, "__name__", "") or "").split(".")[0] in PROJECT_PACKAGES
                     for attr, value in list(vars(m).items())
                     if value is original or value is unwrapped]
        return found

    def mutant(*args: Any, **kwargs: Any) -> Any:
        saved = [(m, attr, getattr(m, attr)) for m, attr in bindings()]
        for m, attr, _ in saved:
            setattr(m, attr, replacement)
        try:
            if impl is original or inspect.unwrap(impl) is unwrapped:
                return replacement(*args, **kwargs)
            return impl(*args, **kwargs)
        finally:
            for m, attr, value in saved:
                setattr(m, attr, value)

    mutant.__name__ = f"mutant_{function}"
    return mutant
