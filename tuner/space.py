"""Search spaces: named dimensions with their choices and named constraints, from TOML.

Pure: `enumerate_layouts` lists every valid layout of a workload; `why_invalid` says why one is not.
Constraints are small expressions evaluated by a restricted evaluator (no Python eval: tuner.space_constraints).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import re
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.errors import SpecError, UsageError
from tuner.layout import (BY_NAME, LAYOUT_FIELDS, SEARCHED, Layout, layout_from,
                          why_invalid as layout_why_invalid, why_invalid_cut, why_invalid_schedule,
                          why_invalid_values, expert_data_parallel, batch_hint)
from tuner.frameworks import REFUSAL_READS, of as framework_of, recompute_refusal
from tuner.pipeline_split import why_invalid_split
from tuner.presets import preset_dir, read_toml
from tuner.space_constraints import Constraint, constraint_env, evaluator, parse_constraint
from tuner.specs import Workload

DIMENSIONS = SEARCHED     # the dimensions a space chooses (tuner.layout.DIMENSIONS); dp follows
EXPERT_DIMS = ("expert_parallel", "expert_tensor_parallel")


def _check_choices(dim: str, values: list, where: str) -> None:
    """Each choice of a dimension has its type (a str dimension: one of its values)."""
    d = BY_NAME[dim]
    low = 0 if dim in ("zero_stage", "offload_layers") else 1
    for v in values:
        ok = (v in d.choices) if d.type is str else (isinstance(v, bool) if d.type is bool else
                                                      isinstance(v, int) and not isinstance(v, bool) and v >= low
                                                      and (dim != "zero_stage" or v <= 3))
        if not ok:
            want = (f"one of {', '.join(map(repr, d.choices))}" if d.type is str else
                    "true or false" if d.type is bool else "ZeRO stages 0-3" if dim == "zero_stage" else
                    f"whole numbers >= {low}")
            raise SpecError(f"{where}: dimension '{dim}' has choice {v!r}; its choices must be {want}")


def pipeline_stages(num_layers: int) -> list[int]:
    """The pp choices of "stages:num_layers": every divisor of the layers (equal stages) and of layers + 2
    (Megatron-Core's embedding- and loss-aware split), and the powers of two that leave each stage two
    layers or more (an uneven split, tuner.pipeline_split: DeepSeek-V3's 61 layers on pp 4, 8, 16)."""
    L = num_layers
    twos = {1 << k for k in range(L.bit_length()) if 2 * (1 << k) <= L}
    return sorted((set(divisors(L)) | set(divisors(L + 2)) | twos) - {L + 2})


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, in O(sqrt n) (a huge model size must not hang enumeration)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SearchSpace:
    name: str
    dimensions: dict          # name -> list of choices, "divisors:<model key>" or "stages:num_layers"
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
        for table in ("dimensions", "constraints"):
            if not isinstance(data.get(table, {}), dict):
                raise SpecError(f"{where}: '{table}' must be a table ([{table}] with one key per entry), "
                                f"got {data[table]!r}"[:300])
        dims = dict(data.get("dimensions", {}))
        if "activation_checkpointing" in dims and "recompute" not in dims:    # a space written before recompute
            old = dims.pop("activation_checkpointing")
            dims["recompute"] = [("full" if v else "none") if isinstance(v, bool) else v for v in old] \
                if isinstance(old, list) else old
        bad = set(dims) - set(DIMENSIONS)
        if bad:
            raise SpecError(f"{where}: unknown dimension(s) {', '.join(sorted(bad))}; valid: {', '.join(DIMENSIONS)}")
        for k, v in dims.items():
            if isinstance(v, str):
                ok = v == "stages:num_layers" or (v.startswith("divisors:") and v.split(":", 1)[1] in (
                    "num_layers", "num_attention_heads", "hidden_size", "global_batch", "num_experts"))
                if not ok:
                    raise SpecError(f"{where}: dimension '{k}' = {v!r}: use a list, \"divisors:num_layers\" "
                                    "(num_attention_heads, hidden_size, global_batch, num_experts) or "
                                    "\"stages:num_layers\"")
            elif not (isinstance(v, list) and v):
                raise SpecError(f"{where}: dimension '{k}' must be a non-empty list of choices")
            else:
                _check_choices(k, v, where)
        cons = data.get("constraints", {})
        for k, v in cons.items():
            if not isinstance(v, str):
                raise SpecError(f"{where}: constraint '{k}' must be a string expression")
            parse_constraint(k, v, where)
        return cls(Path(where).stem, dims, cons)

    def pinned(self, values: dict) -> "SearchSpace":
        """The space with each dimension of `values` fixed to that one choice (plan/search --cp 2 ...)."""
        if not values:
            return self
        return SearchSpace(self.name, {**self.dimensions, **{k: [v] for k, v in values.items()}}, self.constraints)

    def choices(self, dim: str, workload: Workload) -> list:
        """The choices of a dimension; one the space does not name takes its default (micro_batch 1)."""
        v = self.dimensions.get(dim)
        if v is None:
            default = BY_NAME[dim].default
            return [1 if default is None else default]
        if v == "stages:num_layers":
            return pipeline_stages(workload.model.num_layers)
        if isinstance(v, str):
            key = v.split(":", 1)[1]
            n = workload.global_batch if key == "global_batch" else getattr(workload.model, key)
            return divisors(n) if n else [1]        # a dense model's num_experts 0: ep 1 only
        if dim in EXPERT_DIMS and not workload.model.is_moe and BY_NAME[dim].default in v:
            return [BY_NAME[dim].default]           # a dense model has no experts to split
        return list(v)

    def why_invalid(self, layout: Layout, workload: Workload) -> str | None:
        reason = layout_why_invalid(layout, workload)
        if reason:
            return reason
        for dim in DIMENSIONS:
            if dim in self.dimensions and getattr(layout, dim) not in self.choices(dim, workload):
                return f"{dim}={getattr(layout, dim)} is not among the space's choices"
        env = constraint_env(layout, workload)
        for name, expr in self.constraints.items():
            if not evaluator(parse_constraint(name, expr, self.name))(env):
                return f"constraint '{name}' ({expr}) does not hold"
        return None

    def enumerate_layouts(self, workload: Workload) -> list[Layout]:
        """Every valid layout of the space for the workload, in Layout's own order. The GPU count
        fixes dp, so only (tp, cp, pp) that divide it are expanded, and only (pp, vp, pipeline_split) that cut
        the layers; the model's cut (tp, sp, cp, pp, vp, split, ep, etp) is checked once -- its rules and the
        constraints that read nothing else -- then each micro-batch (with the constraints that read nothing
        but the cut, the micro-batch and m), before the ZeRO and recompute choices are."""
        rest = [d for d in DIMENSIONS if d not in CUT and d != "micro_batch"]
        outer, early, per_mb, late = [], [], [], []
        for k, v in self.constraints.items():
            c = Constraint(parse_constraint(k, v, self.name), workload)
            (late if set(c.dims) & set(rest) else per_mb if "micro_batch" in c.dims else
             outer if set(c.dims) <= set(OUTER) else early).append(c)
        choices = {d: [BY_NAME[d].type(v) for v in self.choices(d, workload)] for d in DIMENSIONS}
        one = Layout(tp=1, pp=1, dp=1, micro_batch=1)     # recompute modes the model or framework never runs
        choices["recompute"] = [r for r in choices["recompute"] if recompute_refusal(
            workload.framework, dataclasses.replace(one, recompute=r), workload) is None] or choices["recompute"]
        refusal = framework_of(workload).refusal
        reads = operator.itemgetter(*REFUSAL_READS.get(workload.framework, CUT))    # what a refusal reads of a cut
        refused: dict = {}                 # the ZeRO / recompute choices the framework runs, by what its refusal reads
        rests = [dict(zip(rest, more)) for more in sorted(itertools.product(*(choices[d] for d in rest)))]
        plain = {d: getattr(one, d) for d in rest}         # Layout's defaults of the rest (ZeRO stage, recompute)
        unsharded = {**plain, "zero_stage": 0}
        out = []
        for shape in sorted(self._cuts(choices, workload, outer), key=lambda cut: tuple(cut.values())):
            probe = layout_from(shape, {"micro_batch": 1}, plain)      # Layout(**shape, micro_batch=1)
            if why_invalid_values(probe, workload) or why_invalid_cut(probe, workload.model) or \
                    not all(c(probe) for c in early):
                continue
            runs = None                        # the ZeRO / recompute choices the framework runs on this cut
            for mb in sorted(choices["micro_batch"]):
                batch = {**shape, "micro_batch": mb}
                probe = layout_from(batch, unsharded)                   # Layout(**shape, micro_batch=mb, zero_stage=0)
                if why_invalid_schedule(probe, workload) or (
                        per_mb and not all(c(probe) for c in per_mb)):
                    continue                   # the schedule's rules read nothing but the cut and micro-batch
                if runs is None:               # a refusal never reads the micro-batch (Framework.refusal)
                    key = reads(shape)
                    runs = refused.get(key)
                    if runs is None:
                        runs = refused[key] = [r for r in rests if not refusal(layout_from(batch, r), workload)]
                for more in runs:
                    lay = layout_from(batch, more)               # field order: the cut, mb, the rest
                    if not late or all(c(lay) for c in late):
                        out.append(lay)
        # made in Layout's order (cuts, micro-batches and the rest each sorted, in field order), unless a dimension
        # lists a choice twice
        return out if all(len(set(v)) == len(v) for v in choices.values()) else sorted(out, key=_order)

    @staticmethod
    def _cuts(choices: dict, workload: Workload, outer: list | tuple = ()):
        """Each (tp, sp, cp, pp, vp, pipeline_split, ep, etp) as a dict with its dp, where tp*cp*pp divides the
        GPUs, the split cuts the layers and the `outer` constraints (those that read nothing but OUTER) hold
        (the rest of the cut's rules are the caller's)."""
        gpus, layers = workload.gpus, workload.model.num_layers
        for tp, cp, pp in itertools.product(choices["tp"], choices["context_parallel"], choices["pp"]):
            if gpus % (tp * cp * pp):
                continue
            for vp, split in itertools.product(choices["virtual_pipeline"], choices["pipeline_split"]):
                if why_invalid_split(layers, pp, vp, split):
                    continue
                if outer and not all(c(Layout(tp=tp, context_parallel=cp, pp=pp, virtual_pipeline=vp, pipeline_split=split,
                                              dp=gpus // (tp * cp * pp), micro_batch=1)) for c in outer):
                    continue
                for sp, ep, etp in itertools.product(choices["sequence_parallel"], choices["expert_parallel"],
                                                     choices["expert_tensor_parallel"]):
                    yield {"tp": tp, "sequence_parallel": sp, "context_parallel": cp, "pp": pp, "virtual_pipeline": vp,
                           "pipeline_split": split, "dp": gpus // (tp * cp * pp), "expert_parallel": ep,
                           "expert_tensor_parallel": etp}        # Layout's field order (layout_from)


CUT = ("tp", "sequence_parallel", "context_parallel", "pp", "virtual_pipeline", "pipeline_split", "expert_parallel",
       "expert_tensor_parallel")
#: The part of a cut a constraint may be checked on before sp, ep and etp are chosen (SearchSpace._cuts).
OUTER = ("tp", "context_parallel", "pp", "virtual_pipeline", "pipeline_split", "dp")


#: Layout's own order (its fields in turn, as its dataclass compares them), as a key: one tuple a layout.
_order = operator.attrgetter(*LAYOUT_FIELDS)


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


def no_divisor_reason(pick: dict, gpus: int) -> str:
    """Why no tp*cp*pp divides the GPUs, with the fix: the degree none of whose choices divides them, first."""
    for flag, dim in (("tp", "tp"), ("cp", "context_parallel"), ("pp", "pp")):
        if all(gpus % v for v in pick[dim]):
            return (f"no {flag} among the space's choices ({', '.join(map(str, pick[dim]))}) divides {gpus} GPUs: "
                    f"pick a --{flag} that does")
    return f"no tp*cp*pp among the space's choices divides {gpus} GPUs: pick --tp, --cp and --pp whose product does"


def no_layout_reason(space: SearchSpace, workload: Workload) -> str:
    """Why a workload has no valid layout: every refusal among the candidates at once (one example of each:
    refusals that differ only in their numbers count as one), first the one that refuses the plainest
    candidate (least cp, then pp, tp, micro-batch): what still blocks when every other cause is pinned
    away, so the real blocker is never hidden behind a dimension's refusal."""
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    plainest: dict[str, tuple] = {}
    pick = {d: space.choices(d, workload) for d in DIMENSIONS}
    vp = min(pick["virtual_pipeline"])     # the plainest the space allows (sp, ZeRO: the plainest the framework runs)
    allowed = framework_of(workload).zero_stages
    zero = min([z for z in pick["zero_stage"] if z in allowed] or pick["zero_stage"])
    ep, etp = min(pick["expert_parallel"]), min(pick["expert_tensor_parallel"])   # the plainest, or the pin
    off = min(pick["offload_layers"])
    cuts = ("tp", "context_parallel", "pp", "micro_batch")
    for tp, cp, pp, mb in itertools.product(*(pick[d] for d in cuts)):
        if workload.gpus % (tp * cp * pp):
            continue
        tries = [space.why_invalid(Layout(tp=tp, sequence_parallel=sp, context_parallel=cp, pp=pp, virtual_pipeline=vp,
                                          pipeline_split=split, dp=workload.gpus // (tp * cp * pp), expert_parallel=ep,
                                          expert_tensor_parallel=etp, micro_batch=mb, zero_stage=zero,
                                          recompute=pick["recompute"][-1], offload_layers=off), workload)
                 for sp in sorted(pick["sequence_parallel"]) for split in pick["pipeline_split"]]
        r = None if None in tries else tries[0]
        if r:
            kind = re.sub(r"\d+", "#", r)
            counts[kind] = counts.get(kind, 0) + 1
            example.setdefault(kind, r)
            plainest[kind] = min(plainest.get(kind, (cp, pp, tp, mb)), (cp, pp, tp, mb))
    if not counts:
        return no_divisor_reason(pick, workload.gpus)
    first, *rest = sorted(counts, key=lambda k: (plainest[k], -counts[k]))
    rest.sort(key=lambda k: -counts[k])
    others = f" (other layouts are also refused: {'; '.join(example[k] for k in rest)})" if rest else ""
    return example[first] + others


def valid_layouts(space: SearchSpace, workload: Workload) -> list[Layout]:
    """Every valid layout of `space` for `workload`; UsageError saying why when there is none."""
    layouts = space.enumerate_layouts(workload)
    if not layouts:
        why = no_layout_reason(space, workload)
        hint = batch_hint(workload, lambda w: bool(space.enumerate_layouts(w))) if "global batch" in why else ""
        raise UsageError(f"no valid layout for {workload.model.name} on {workload.nodes} node(s) "
                         f"({workload.gpus} GPUs): {why}{hint}")
    layouts = one_zero_stage_where_unsharded(layouts, workload)
    if "offload_layers" in space.dimensions:       # named or pinned: the space's own choices
        return layouts
    from tuner.space_offload import with_offload   # else an offloaded twin where it rescues a layout (Megatron-Core)
    return with_offload(layouts, workload)


def one_zero_stage_where_unsharded(layouts: list[Layout], workload: Workload) -> list[Layout]:
    """ZeRO stages shard model states over the data-parallel group (dp*cp; an expert's over its expert-dp
    group): where both are 1 every stage is the same run, so only the framework's own first stage among
    them is kept (tp2-pp8-dp1 is one layout, not one per stage). Not under DeepSpeed's engine (Megatron-DeepSpeed):
    it steps ZeRO 0 with its BF16_Optimizer and ZeRO 1-3 with its ZeRO optimizers, other buffers and copies even
    over one rank (the model predicts them apart: memory.step_copy_bytes), so each stage stays a layout of its own."""
    fw = framework_of(workload)
    if fw.deepspeed_step:
        return layouts
    order = {z: i for i, z in enumerate(fw.zero_stages)}
    moe = workload.model.is_moe
    unsharded = [lay.dp * lay.context_parallel == 1 and (not moe or expert_data_parallel(lay) == 1) for lay in layouts]
    kept: dict[Layout, Layout] = {}      # the unsharded ones by their layout at any ZeRO stage (a sharded one stays)
    for lay in itertools.compress(layouts, unsharded):
        key = replace(lay, zero_stage=-1)
        if key not in kept or order.get(lay.zero_stage, 99) < order.get(kept[key].zero_stage, 99):
            kept[key] = lay
    if len(kept) == sum(unsharded):
        return layouts
    keep = set(kept.values())
    return [lay for lay, alone in zip(layouts, unsharded) if not alone or lay in keep]
