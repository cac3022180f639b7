"""A search space's constraints: small expressions over a layout and its workload (NAMES), checked once when the
space is read (`parse_constraint`) and evaluated by tuner's own restricted evaluator (`evaluator`: no Python eval);
`Constraint` keeps each answer by the layout values it reads during one enumeration (tuner.space). Pure.
"""

from __future__ import annotations

import ast
import functools
import operator
import types

from tuner.errors import SpecError
from tuner.frameworks import split_refusal
from tuner.layout import DIMENSIONS as LAYOUT_DIMS, LAYOUT_FIELDS, Layout, micro_batches_per_pipeline
from tuner.pipeline_split import why_invalid_split
from tuner.specs import Workload

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne,
        ast.USub: operator.neg, ast.Not: operator.not_}
NAMES = (*(d.name for d in LAYOUT_DIMS), "gpus", "nodes", "gpus_per_node", "num_layers", "hidden_size",
         "num_attention_heads", "num_query_groups", "seq_length", "global_batch", "m", "num_experts",
         "activation_checkpointing",     # recompute == "full", for constraints written before recompute
         "auto_split_runs")              # the layout's framework runs its cut with pipeline_split auto


def evaluator(node: ast.AST):
    """A function env -> value for a checked expression tree (tuner's own small evaluator, no Python
    eval): each node becomes a closure once, so a constraint costs a few calls per layout."""
    if isinstance(node, ast.Expression):
        return evaluator(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str)):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        return lambda env: env[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        op, left, right = _OPS[type(node.op)], evaluator(node.left), evaluator(node.right)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        op, operand = _OPS[type(node.op)], evaluator(node.operand)
        return lambda env: op(operand(env))
    if isinstance(node, ast.BoolOp):
        parts = [evaluator(v) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if isinstance(node, ast.Compare):
        first = evaluator(node.left)
        pairs = [(_OPS[type(op)], evaluator(c)) for op, c in zip(node.ops, node.comparators)]

        def compare(env):
            left = first(env)
            for op, comp in pairs:
                right = comp(env)
                if not op(left, right):
                    return False
                left = right
            return True
        return compare
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def parse_constraint(name: str, expr: str, where: str) -> ast.Expression:
    """The checked expression tree of a constraint: only NAMES and arithmetic, comparisons and and / or (SpecError
    naming the constraint otherwise)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise SpecError(f"{where}: constraint '{name}' is not an expression: {exc.msg}") from None
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id not in NAMES:
            raise SpecError(f"{where}: constraint '{name}' uses unknown name '{n.id}'; names: {', '.join(NAMES)}")
        allowed = (ast.Expression, ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
                   ast.Load, ast.And, ast.Or, *_OPS)
        if not isinstance(n, allowed):
            raise SpecError(f"{where}: constraint '{name}' uses unsupported {type(n).__name__}")
    return tree


def auto_split_runs(layout: Layout, w: Workload) -> bool:
    """Whether pipeline_split auto cuts the layout's layers and its framework runs that cut (Megatron-DeepSpeed
    does not run Megatron-Core's embedding- and loss-aware split)."""
    return _auto_runs(w.framework, w.model.num_layers, layout.pp, layout.virtual_pipeline)


@functools.lru_cache(maxsize=4096)
def _auto_runs(framework: str, num_layers: int, pp: int, vp: int) -> bool:
    if why_invalid_split(num_layers, pp, vp, "auto"):
        return False
    lay = Layout(tp=1, pp=pp, virtual_pipeline=vp, dp=1, micro_batch=1)
    return split_refusal(framework, lay, types.SimpleNamespace(num_layers=num_layers)) is None


def constraint_env(layout: Layout, w: Workload) -> dict:
    """The values a constraint's names take for a layout of a workload (NAMES)."""
    m = w.model
    return {**layout.as_dict(), "gpus": w.gpus, "nodes": w.nodes, "gpus_per_node": w.cluster.gpus_per_node,
            "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
            "num_query_groups": m.num_query_groups, "seq_length": m.seq_length, "global_batch": w.global_batch,
            "num_experts": m.num_experts,
            "activation_checkpointing": layout.recompute == "full",
            "auto_split_runs": auto_split_runs(layout, w),
            "m": micro_batches_per_pipeline(layout, w.global_batch) if layout.dp else 0}


#: What a name of a constraint's environment (constraint_env) reads of the layout beside the layout's own
#: dimensions; the other names are the workload's.
_READS = {"activation_checkpointing": ("recompute",), "auto_split_runs": ("pp", "virtual_pipeline"),
          "m": ("micro_batch", "dp")}


class Constraint:
    """A space's constraint during one enumeration: its answer kept by the layout values it reads (`dims`), so
    the layouts that differ elsewhere are not asked again."""

    def __init__(self, tree: ast.Expression, workload: Workload):
        self.check, self.workload = evaluator(tree), workload
        self.names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        reads = self.names | {d for n in self.names for d in _READS.get(n, ())}
        self.dims = tuple(d for d in LAYOUT_FIELDS if d in reads)
        self.seen: dict = {}

    def __call__(self, layout: Layout) -> bool:
        key = tuple(getattr(layout, d) for d in self.dims)
        got = self.seen.get(key)
        if got is None:
            got = self.seen[key] = bool(self.check(constraint_env(layout, self.workload)))
        return got
