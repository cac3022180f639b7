"""Search spaces: named dimensions with their choices and named constraints, from TOML.

Pure: `enumerate_layouts` lists every valid layout of a workload; `why_invalid` says why one is not.
Constraints are small expressions evaluated by a restricted evaluator (no Python eval).
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import SpecError, UsageError
from tuner.layout import DIMENSIONS as LAYOUT_DIMS, SEARCHED, Layout, micro_batches_per_pipeline, why_invalid as layout_why_invalid
from tuner.specs import Workload, preset_dir, read_toml

DIMENSIONS = SEARCHED     # the dimensions a space chooses (tuner.layout.DIMENSIONS); dp follows
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne,
        ast.USub: operator.neg, ast.Not: operator.not_}
NAMES = ("tp", "pp", "dp", "micro_batch", "zero_stage", "activation_checkpointing", "gpus", "nodes",
         "gpus_per_node", "num_layers", "hidden_size", "num_attention_heads", "global_batch", "m")


def _eval(node: ast.AST, env: dict):
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand, env))
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _OPS[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def _compile(name: str, expr: str, where: str) -> ast.Expression:
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


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, in O(sqrt n) (a huge model size must not hang enumeration)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SearchSpace:
    name: str
    dimensions: dict          # name -> list of choices, or "divisors:<model key>"
    constraints: dict         # name -> expression text

    def as_record(self) -> dict:
        """How a study stores its space (name, dimensions, constraints)."""
        return {"name": self.name, "dimensions": self.dimensions, "constraints": self.constraints}

    @classmethod
    def from_record(cls, rec: dict) -> "SearchSpace":
        return cls.from_dict({k: v for k, v in rec.items() if k != "name"}, rec.get("name", "space"))

    @classmethod
    def from_dict(cls, data: dict, where: str = "space") -> "SearchSpace":
        unknown = set(data) - {"dimensions", "constraints"}
        if unknown:
            raise SpecError(f"{where}: unknown table(s) {', '.join(sorted(unknown))}; valid: dimensions, constraints")
        dims = data.get("dimensions", {})
        bad = set(dims) - set(DIMENSIONS)
        if bad:
            raise SpecError(f"{where}: unknown dimension(s) {', '.join(sorted(bad))}; valid: {', '.join(DIMENSIONS)}")
        for k, v in dims.items():
            if isinstance(v, str):
                if not (v.startswith("divisors:") and v.split(":", 1)[1] in ("num_layers", "num_attention_heads",
                                                                              "hidden_size", "global_batch")):
                    raise SpecError(f"{where}: dimension '{k}' = {v!r}: use a list or \"divisors:num_layers\"")
            elif not (isinstance(v, list) and v):
                raise SpecError(f"{where}: dimension '{k}' must be a non-empty list of choices")
        cons = data.get("constraints", {})
        for k, v in cons.items():
            if not isinstance(v, str):
                raise SpecError(f"{where}: constraint '{k}' must be a string expression")
            _compile(k, v, where)
        return cls(Path(where).stem, dims, cons)

    def choices(self, dim: str, workload: Workload) -> list:
        v = self.dimensions.get(dim)
        if v is None:
            return {"zero_stage": [1], "activation_checkpointing": [True], "micro_batch": [1]}.get(dim, [1])
        if isinstance(v, str):
            key = v.split(":", 1)[1]
            n = workload.global_batch if key == "global_batch" else getattr(workload.model, key)
            return divisors(n)
        return list(v)

    def _env(self, layout: Layout, w: Workload) -> dict:
        return {**layout.as_dict(), "gpus": w.gpus, "nodes": w.nodes, "gpus_per_node": w.cluster.gpus_per_node,
                "num_layers": w.model.num_layers, "hidden_size": w.model.hidden_size,
                "num_attention_heads": w.model.num_attention_heads, "global_batch": w.global_batch,
                "m": micro_batches_per_pipeline(layout, w.global_batch) if layout.dp else 0}

    def why_invalid(self, layout: Layout, workload: Workload) -> str | None:
        reason = layout_why_invalid(layout, workload)
        if reason:
            return reason
        for dim in DIMENSIONS:
            if dim in self.dimensions and getattr(layout, dim) not in self.choices(dim, workload):
                return f"{dim}={getattr(layout, dim)} is not among the space's choices"
        env = self._env(layout, workload)
        for name, expr in self.constraints.items():
            if not _eval(_compile(name, expr, self.name), env):
                return f"constraint '{name}' ({expr}) does not hold"
        return None

    def enumerate_layouts(self, workload: Workload) -> list[Layout]:
        """Every valid layout of the space for the workload, in a stable order."""
        compiled = [_compile(k, v, self.name) for k, v in self.constraints.items()]
        out = []
        for values in itertools.product(*(self.choices(d, workload) for d in DIMENSIONS)):
            v = dict(zip(DIMENSIONS, values))
            if workload.gpus % (v["tp"] * v["pp"]):
                continue
            lay = Layout(**{d.name: d.type(v[d.name]) for d in LAYOUT_DIMS if d.searched},
                         dp=workload.gpus // (v["tp"] * v["pp"]))
            if layout_why_invalid(lay, workload):
                continue
            env = self._env(lay, workload)
            if all(_eval(c, env) for c in compiled):
                out.append(lay)
        return sorted(out)


def load_space(name: str | None = None) -> SearchSpace:
    """A space by path, or by name from the working directory's search_spaces/, then the shipped ones
    (importlib.resources; `search_spaces/default.toml` also names the shipped file from anywhere)."""
    name = name or "default"
    shipped = preset_dir("search_spaces")
    candidates = [Path(name)] if (name.endswith(".toml") or "/" in name) else []
    candidates += [Path("search_spaces") / f"{name}.toml", shipped / f"{name}.toml", shipped / Path(name).name]
    for p in candidates:
        if p.is_file():
            return SearchSpace.from_dict(read_toml(p), str(p))
    known = sorted(t.name[:-len(".toml")] for t in shipped.iterdir() if t.name.endswith(".toml"))
    raise SpecError(f"search space '{name}' not found; shipped spaces: {', '.join(known)}; or give a path to a TOML file")


def no_layout_reason(space: SearchSpace, workload: Workload) -> str:
    """Why a workload has no valid layout: the most common refusal among the candidates, in full (one
    example of it: refusals that differ only in their numbers count as one)."""
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    for tp, pp in itertools.product(space.choices("tp", workload), space.choices("pp", workload)):
        dp = workload.gpus // (tp * pp) if workload.gpus % (tp * pp) == 0 else 0
        if not dp:
            continue
        for mb in space.choices("micro_batch", workload):
            r = space.why_invalid(Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, zero_stage=min(
                space.choices("zero_stage", workload)), activation_checkpointing=True), workload)
            if r:
                kind = re.sub(r"\d+", "#", r)
                counts[kind] = counts.get(kind, 0) + 1
                example.setdefault(kind, r)
    if not counts:
        return f"no tp*pp among the space's choices divides {workload.gpus} GPUs"
    return example[max(counts, key=counts.get)]


def valid_layouts(space: SearchSpace, workload: Workload) -> list[Layout]:
    """Every valid layout of `space` for `workload`; UsageError saying why when there is none."""
    layouts = space.enumerate_layouts(workload)
    if not layouts:
        raise UsageError(f"no valid layout for {workload.model.name} on {workload.nodes} node(s) "
                         f"({workload.gpus} GPUs): {no_layout_reason(space, workload)}")
    return layouts
