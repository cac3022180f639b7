"""The correction model of the predictions: the performance model's error learned from measurements, and carried
across node counts.

Pure (numpy only, no I/O). The model's prediction is the prior mean of log(measured MFU) -- training speed, so that
every correction, warm start and transfer ranks layouts as samples/s does; what is learned is the residual
r = log(measured / predicted) as a Gaussian process over features of the layout *and* of the model's own account of it:

    r(x) = c + sum_k w_k f_k(x) + g(z(x)) + noise

- c: a global scale (every constant of the cluster file a bit off the same way), and the prior mean
  -log(1 + (k - 1) f_overhead): the fixed cost per micro-batch and chunk taking k times the file's guess, k of
  OVERHEAD_SCALES chosen by marginal likelihood (1 unless the measurements say otherwise);
- f_k: the share of the predicted step spent in component k (GEMMs, attention, element-wise, TP all-reduces, pipeline
  p2p, per-micro-batch overhead, the dense parameters' DP/ZeRO collectives over the data-parallel group, the expert
  parameters' over the expert-data-parallel group, the rest), the pipeline bubble spread over the stage components
  that make it. A cluster constant off by a factor is a residual linear in these shares at any node count: that is
  what transfers;
- g: a squared-exponential GP over z = (log2 tp, log2 pp, log2 dp, log2 micro-batch, ZeRO stage, checkpointing, sp,
  log2 cp, log2 vp, log2 ep, log2 etp (the expert degrees on tp's scale), TP group leaves the node, predicted bubble,
  TP and DP communication shares, log2 nodes) for errors the shares do not explain (physics the model lacks); the
  ZeRO stage a category there (TIME_Z_SCALE: an error at one stage does not carry to the next).
Memory is learned the same way on log(measured peak / predicted peak) with the memory breakdown's shares as f, the
measured peak (allocated bytes) with the cluster's fixed reserve added as the prediction has it
(Features.measured_log_ratio); an OOM is a censored observation (the ratio is at least capacity / predicted).
The time GP's predictive sd is calibrated by its leave-one-out z-scores (widened, never narrowed). A trial stopped
early (multi-fidelity) is censored: its partial throughput is an upper bound on the layout's speed, so it enters the
GP only where the posterior mean still sits above that bound.

`warm_start_records` turns stored trials of the same model and cluster (any node count) into observations;
tuner/best.py uses them to answer "best layout for N nodes" where N was never measured. Measurements only: a
simulated trial (`simulated`: the simulator's numbers are the model's own prediction) is never evidence, and a
measurement corrects predictions for its own framework only (no benchmark shows that a correction learned on one
training stack helps another); the evidence counts what was left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from tuner.frameworks import ALLOCATOR_SD
from tuner.gp import GRID, GP, RatioGP, fit_gp
from tuner.layout import RECOMPUTE, Layout
from tuner.offload import offload_share
from tuner.perfmodel import MEMORY_KEYS, MEMORY_NOISE_SD, comm, memory_gp_scales, memory_shares, predict
from tuner.perfmodel.fit import run_need_gb
from tuner.specs import Workload, stored_framework
from tuner.trial import SIMULATED, Status

STAGE_KEYS = ("gemm", "attention", "elementwise", "tp_comm", "cp_comm", "p2p", "microbatch_overhead")
STOPPED_NOISE = 0.03          # log-noise of a stopped trial's upper bound (a few steps after warm-up)
HISTORY_NOISE = 0.04          # extra log-noise of a stored trial from another study (drift between runs)
OOM_MARGIN = 0.03             # an OOM says the memory ratio is at least capacity/predicted; assume a bit more
#: Widenings of the memory correction's prior tried by marginal likelihood, of the whole prior and (as much or more) of
#: the working memory and the gradients (activations under each recompute mode, logits, buffers, the gradients under
#: each ZeRO stage: what kernels and an optimizer's buffers keep, where weights and Adam's states are exact; round 46):
#: measurements the framework's memory error cannot explain widen it, so the correction follows them and its
#: uncertainty grows away from them; data the prior explains keep it (the account's own prior wins ties). They start
#: from a GPU run's scale, the account's and the caching allocator's share together (ALLOCATOR_SD), not the account's
#: alone (issue 24 / 30): where it is exact on allocated bytes (Megatron-Core's memory_sd 0.00027) 16 times its scale
#: is 0.4 %, which held a 30 % measured bias at 1 %.
MEMORY_WIDENING = (1.0, 2.0, 4.0, 8.0, 16.0)
#: observations before the working memory is widened apart from the rest (a split is not learned from one point;
#: a single measurement far off the prior widens the whole prior, so one run moves the correction and leaves it wide)
MEMORY_WIDEN_MIN = 3
Z_DIM, F_DIM, FM_DIM = 17, len(STAGE_KEYS) + 3, len(MEMORY_KEYS) + 5
#: The time correction reads the ZeRO stage (z's coordinate ZERO_COORD, stage / 3) as a category (issue 30 round 19):
#: stage 3 gathers the parameters every micro-batch, stage 2 reduce-scatters the gradients, stage 1 shards the optimizer
#: state only, so an error at one stage says nothing through g about the next (stages lie 3 times the grid's longest
#: length-scale apart: about 1 % carries); the constant and the shares carry what they share. Memory keeps it a scale.
ZERO_COORD = 4
TIME_Z_SCALE = np.ones(Z_DIM)
TIME_Z_SCALE[ZERO_COORD] = 3 * max(ell for *_, ell in GRID) * 3     # stages lie 1/3 apart in z
#: The fixed cost per micro-batch and chunk (the cluster file's microbatch_overhead_ms) as the time correction's prior
#: mean may read it: that many times the file's figure, chosen with the GP's shape by marginal likelihood (1 wins ties).
#: The other shares rest on measured rates, off by tens of percent, which the linear term's prior holds; this one is a
#: guess that a framework's host loop can exceed many times over -- DeepSpeed's pipeline engine interprets its schedule
#: in Python -- beyond what a linear term in its small share can learn (issue 30 round 39; chosen before any draw).
OVERHEAD_COL = STAGE_KEYS.index("microbatch_overhead")
OVERHEAD_SCALES = (1.0, 3.0, 10.0, 30.0)


def time_fit() -> dict:
    """How the time correction's GP is fitted (tuner.gp.fit_gp): the ZeRO stage a category, the overhead scaled."""
    return {"z_scale": TIME_Z_SCALE, "scaled_col": OVERHEAD_COL, "scales": OVERHEAD_SCALES}


#: z's first coordinates: the layout's own (tp, pp, dp, micro-batch, ZeRO, recompute, sp, cp, vp, ep, etp, layers
#: offloaded: tuner.offload.offload_share; the expert degrees keep an expert split's error to it: issue 30 round 11).
LAYOUT_DIMS = 12
#: How far (in those coordinates) a measured layout's support reaches (the guided searcher's ELL_U): a layout this far
#: or further from every measured one is as uncertain as the spread of the model's errors among the measured (far_sd).
FAR_REACH = 0.35
_ACT = MEMORY_KEYS.index("activations")
_GRAD = MEMORY_KEYS.index("gradients")
_WIDENED = np.array([k in ("gradients", "activations", "logits", "zero3_buffers") for k in MEMORY_KEYS] + [True] * 5)


def memory_features(breakdown: dict, recompute: str, zero_stage: int) -> np.ndarray:
    """The memory correction's linear features: each component's share of the predicted peak, the
    activations' share under its recompute mode's own name (none, full, any selective set): each mode's
    account of what a layer keeps is its own formula, so each may be off by its own factor. The gradients' share
    likewise under its ZeRO stage's name (0 in the gradients' own slot, 1-3 after the modes; issue 30 round 46):
    each stage's are another optimizer's buffers (DeepSpeed's BF16_Optimizer keeps an accumulation buffer, its ZeRO-1
    optimizer none), so a buffer the account lacks at one stage carries to an unmeasured dp as that stage keeps it."""
    shares = memory_shares(breakdown)
    act, shares[_ACT] = shares[_ACT], 0.0
    mode = [0.0, 0.0, 0.0]
    mode[0 if recompute == "none" else 2 if recompute == "full" else 1] = act
    stage = [0.0, 0.0, 0.0]
    if zero_stage:
        stage[zero_stage - 1], shares[_GRAD] = shares[_GRAD], 0.0
    return np.array(shares[:_ACT] + [mode[0]] + shares[_ACT + 1:] + mode[1:] + stage)
FLOOR = 1e-3                  # never trust a predicted zero: predictions are floored here (MFU)


@dataclass
class Features:
    """What the correction sees of one layout on one workload."""

    z: np.ndarray                  # smooth-kernel coordinates
    f: np.ndarray                  # time shares (linear kernel)
    fm: np.ndarray                 # memory shares (linear kernel of the memory correction)
    log_pred: float                # log predicted MFU (the prior mean)
    log_mem: float                 # log predicted peak memory (GB)
    fits: bool                     # the model's own verdict
    reserve_gb: float = 0.0        # the cluster's fixed reserve in log_mem (what a measured peak lacks)

    def measured_log_ratio(self, peak_gb: float, reserved_gb: float | None = None) -> float:
        """log(measured / predicted peak) of a runner's measured peak (allocated bytes), the reserve added to it
        as the prediction has it (tuner.perfmodel.fit.measured_need_gb) -- or its reserved peak plus the reserve
        when that is larger and the runner read it (run_need_gb)."""
        return math.log(run_need_gb(peak_gb, self.reserve_gb, reserved_gb)) - self.log_mem


def features(layout: Layout, workload: Workload | None, pred=None) -> Features:
    """Features of `layout` on `workload` (None: layout coordinates only, a flat prior)."""
    base = [math.log2(layout.tp) / 4, math.log2(layout.pp) / 6, math.log2(max(layout.dp, 1)) / 8,
            math.log2(layout.micro_batch) / 4, layout.zero_stage / 3, RECOMPUTE.index(layout.recompute) / (len(RECOMPUTE) - 1),
            0.3 * layout.sequence_parallel, math.log2(layout.context_parallel) / 4,
            math.log2(layout.virtual_pipeline) / 8, math.log2(layout.expert_parallel) / 4,
            math.log2(layout.expert_tensor_parallel) / 4, offload_share(layout, workload)]
    if workload is None:
        return Features(np.array(base + [0.0] * 5), np.zeros(F_DIM), np.zeros(FM_DIM), math.log(0.3), 0.0, True)
    pred = pred or predict(layout, workload)
    t = pred.time_breakdown
    step = max(pred.step_time_s, 1e-12)
    stage = sum(t.get(k, 0.0) for k in STAGE_KEYS) or 1e-12
    bubble = t.get("bubble", 0.0)
    shares = [(t.get(k, 0.0) * (1 + bubble / stage)) / step for k in STAGE_KEYS]
    dense_dp = (t.get("dp_grad_reduce", 0.0) + t.get("dp_param_gather", 0.0)) / step
    expert_dp = (t.get("dp_expert_grad_reduce", 0.0) + t.get("dp_expert_param_gather", 0.0)) / step
    dp = dense_dp + expert_dp
    other = max(0.0, 1.0 - sum(shares) - dp)
    cross = float(comm.crosses_nodes(workload.cluster, layout.tp, 1))
    z = np.array(base + [cross, bubble / step, shares[3] + shares[4], dp, math.log2(workload.nodes) / 8])
    fm = memory_features(pred.memory_breakdown, layout.recompute, layout.zero_stage)
    return Features(z, np.array(shares + [dense_dp, expert_dp, other]), fm, math.log(max(pred.mfu, FLOOR)),
                    math.log(max(pred.memory_gb, 1e-6)), bool(pred.fits), workload.cluster.memory_reserved_gb)


# ------------------------------------------------------------------------------------------------ observations
def _farness(Z: np.ndarray, measured: list) -> np.ndarray:
    """1 - exp(-d^2 / 2 FAR_REACH^2) of each row of Z, d its distance in layout coordinates to the nearest of
    `measured` (feature rows): 0 at a measured layout, towards 1 far from every one (far_sd, memory_far_sd)."""
    return 1.0 - np.exp(-0.5 * layout_d2(Z, measured) / FAR_REACH ** 2)


def layout_d2(Z: np.ndarray, measured: list) -> np.ndarray:
    """Each row of Z's squared distance to the nearest of `measured` in layout coordinates (FAR_REACH's units)."""
    M = np.array(measured, float).reshape(len(measured), Z_DIM)[:, :LAYOUT_DIMS]
    return ((np.asarray(Z, float)[:, None, :LAYOUT_DIMS] - M[None, :, :]) ** 2).sum(-1).min(1)


@dataclass
class Observations:
    """Residual observations for the time and the memory corrections."""

    Z: list = field(default_factory=list)
    F: list = field(default_factory=list)
    y: list = field(default_factory=list)
    noise: list = field(default_factory=list)
    mZ: list = field(default_factory=list)
    mF: list = field(default_factory=list)
    my: list = field(default_factory=list)
    mnoise: list = field(default_factory=list)
    cZ: list = field(default_factory=list)        # censored time observations: upper bounds (stopped early)
    cF: list = field(default_factory=list)
    cy: list = field(default_factory=list)
    cnoise: list = field(default_factory=list)
    oZ: list = field(default_factory=list)        # censored memory observations: lower bounds (out of memory)
    oF: list = field(default_factory=list)
    oy: list = field(default_factory=list)
    onoise: list = field(default_factory=list)
    mR: list = field(default_factory=list)        # each peak's (reserved GB, log_mem) where its runner read it, or None
    outside_gb: float | None = None               # memory outside the allocator its OOMs said (memory_y)

    def add_time(self, ft: Features, measured: float, noise: float = 0.0) -> None:
        self.Z.append(ft.z), self.F.append(ft.f), self.noise.append(noise)
        self.y.append(math.log(max(measured, FLOOR)) - ft.log_pred)

    def add_memory(self, ft: Features, log_ratio: float, noise: float = 0.0, reserved_gb: float | None = None) -> None:
        self.mZ.append(ft.z), self.mF.append(ft.fm), self.my.append(log_ratio), self.mnoise.append(noise)
        self.mR.append((reserved_gb, ft.log_mem) if reserved_gb else None)

    def add_result(self, ft: Features, status: Status, mfu, peak_memory_gb, capacity_gb,
                   noise: float = 0.0, reserved_gb: float | None = None) -> None:
        """What one finished trial says: a time residual, a memory ratio, or an OOM lower bound. A trial
        stopped early (multi-fidelity) says only that the layout is no faster than its partial throughput."""
        if status == Status.OK and mfu:
            self.add_time(ft, float(mfu), noise)
        elif status == Status.STOPPED and mfu:
            self.cZ.append(ft.z), self.cF.append(ft.f), self.cnoise.append(math.hypot(noise, STOPPED_NOISE))
            self.cy.append(math.log(max(float(mfu), FLOOR)) - ft.log_pred)
        if not capacity_gb:
            return
        if status == Status.OK and peak_memory_gb:
            self.add_memory(ft, ft.measured_log_ratio(peak_memory_gb, reserved_gb), noise, reserved_gb)
        elif status == Status.OOM:
            self.oZ.append(ft.z), self.oF.append(ft.fm), self.onoise.append(noise)
            self.oy.append(max(math.log(capacity_gb) - ft.log_mem, 0.0) + OOM_MARGIN)

    def extend(self, other: "Observations") -> None:
        for k in ("Z", "F", "y", "noise", "mZ", "mF", "my", "mnoise", "cZ", "cF", "cy", "cnoise", "oZ", "oF", "oy",
                  "onoise", "mR"):
            getattr(self, k).extend(getattr(other, k))

    def time_data(self) -> tuple[np.ndarray, np.ndarray, list, list]:
        """(Z, F, y, noise) of the time GP: the measurements, plus each censored upper bound that the
        measurements alone would put the layout above (clamped to the bound)."""
        Z, F, y, noise = list(self.Z), list(self.F), list(self.y), list(self.noise)
        if self.cy:
            gp = fit_gp(np.array(Z), np.array(F), y, noise, **time_fit()) if y else GP(z_scale=TIME_Z_SCALE)
            mu, _ = gp.predict(np.array(self.cZ), np.array(self.cF))
            for i in np.flatnonzero(mu > np.array(self.cy)):
                Z.append(self.cZ[i]), F.append(self.cF[i]), y.append(self.cy[i]), noise.append(self.cnoise[i])
        return np.array(Z).reshape(len(y), Z_DIM), np.array(F).reshape(len(y), F_DIM), y, noise

    def time_gp(self, **kw) -> GP:
        Z, F, y, noise = self.time_data()
        kw = {**time_fit(), **kw}
        if not y:
            return GP(z_scale=kw["z_scale"])
        return fit_gp(Z, F, y, noise, **kw)

    def far_sd(self, Z) -> np.ndarray:
        """The part of a corrected speed's uncertainty that grows with distance from measured layouts (issue 30):
        the spread (sd) of the model's errors among the measured layouts, log(measured / predicted), times
        1 - exp(-d^2 / 2 FAR_REACH^2), d the distance in layout coordinates to the nearest measured one. The
        time GP, fitted on a few trials, may learn a smooth correction that it then carries with a narrow sd to
        a family nobody measured; a model wrong by that spread where it was measured is no better trusted
        where it was not. 0 with fewer than two measurements."""
        Z = np.asarray(Z, float).reshape(-1, Z_DIM)
        if len(self.y) < 2:
            return np.zeros(len(Z))
        return float(np.std(self.y)) * _farness(Z, self.Z)

    def memory_far_sd(self, Z) -> np.ndarray:
        """far_sd's counterpart for memory, where `best` answers for a node count nobody measured: the spread (sd) of
        the memory model's errors among the measured peaks, log(measured / predicted), times 1 - exp(-d^2 / 2
        FAR_REACH^2), d the distance in layout coordinates to the nearest layout whose memory a trial showed (a
        peak or an OOM). The memory correction carries what a few trials taught it to layouts unlike them with the
        sd its kernel gives, and its p_fit there was stated above what ran (benchmarks/fit_reliability.py: the
        layouts of ext_search's 2N answers at distance >= 0.7 stated 0.84 and ran 0.73 in [0.7, 0.95), where
        the near ones were calibrated). 0 with fewer than two peaks."""
        Z = np.asarray(Z, float).reshape(-1, Z_DIM)
        if len(self.my) < 2:
            return np.zeros(len(Z))
        return float(np.std(self.my)) * _farness(Z, self.mZ + self.oZ)

    def memory_gp(self, sd: float = 0.06, peaks=None) -> GP:
        """The memory correction; `sd`, the framework's scale of the memory model's error (tuner.frameworks),
        sets its prior (tuner.perfmodel.memory_gp_scales): with no data it is the one `predict` states p_fit
        with (tuner.perfmodel.memory_prior_sd). Its prior is widened by marginal likelihood (MEMORY_WIDENING, from
        a GPU run's scale) when the measurements say the memory model is further off than that. An OOM is a lower bound: it
        enters (at the bound) only where the measured peaks alone would put the layout below it (`peaks`: peaks_gp)."""
        my = self.memory_y()
        gp = peaks if peaks is not None else self._memory_gp(sd, self.mZ, self.mF, my, self.mnoise)
        if not self.oy:
            return gp
        oZ, oF = np.array(self.oZ).reshape(len(self.oy), Z_DIM), np.array(self.oF).reshape(len(self.oy), FM_DIM)
        mu, _ = gp.predict(oZ, oF)
        take = np.flatnonzero(mu < np.array(self.oy))
        if len(take):
            pick = lambda xs, extra: list(xs) + [extra[i] for i in take]   # noqa: E731
            gp = self._memory_gp(sd, pick(self.mZ, self.oZ), pick(self.mF, self.oF), pick(my, self.oy),
                                 pick(self.mnoise, self.onoise))
        return gp.truncated(oZ, oF, self.oy, np.setdiff1d(np.arange(len(self.oy)), take))

    def peaks_gp(self, sd: float = 0.06) -> "RatioGP":
        """memory_gp of the measured peaks alone, no OOM bound (what an OOM is checked against: oom_evidence)."""
        return Observations(mZ=self.mZ, mF=self.mF, my=self.memory_y(), mnoise=self.mnoise).memory_gp(sd)

    def memory_y(self) -> list:
        """The peaks' log ratios, a run that read its reserved peak counted at it plus the memory outside the allocator
        its cluster's OOMs said (`outside_gb`: oom_evidence.outside_gb), where they said it, not the reserve."""
        o = self.outside_gb
        if o is None:
            return self.my
        return [y if r is None else math.log(r[0] + o) - r[1] for y, r in zip(self.my, self.mR, strict=True)]

    @staticmethod
    def _memory_gp(sd: float, Z, F, y, noise) -> "RatioGP":
        s_c, s_w, s_g = memory_gp_scales(sd)
        if not y:
            return RatioGP(GP(s_c=s_c, s_w=s_w, s_g=s_g, ell=0.5, noise=MEMORY_NOISE_SD))
        Z, F = np.array(Z).reshape(len(y), Z_DIM), np.array(F).reshape(len(y), FM_DIM)
        ratio = np.exp(np.asarray(y, float))
        lin, lin_noise = ratio - 1.0, np.asarray(noise, float) * ratio
        scales = [(1.0, 1.0, memory_gp_scales(sd))] + [
            (a, b, memory_gp_scales(math.hypot(sd, ALLOCATOR_SD))) for a in MEMORY_WIDENING for b in MEMORY_WIDENING
            if b >= a and (len(y) >= MEMORY_WIDEN_MIN or b == a)]
        fits = [GP(s_c=a * c, s_w=a * w, s_g=a * g, ell=0.5, noise=MEMORY_NOISE_SD,
                   w_scale=np.where(_WIDENED, b / a, 1.0)).fit(Z, F, lin, lin_noise) for a, b, (c, w, g) in scales]
        gp = max(fits, key=lambda gp: gp.log_marginal() + 1e-9 * (gp is fits[0]))
        return RatioGP(gp.calibrate() if len(y) >= MEMORY_WIDEN_MIN else gp)


@dataclass
class WarmStart:
    observations: Observations
    evidence: dict

    @property
    def empty(self) -> bool:
        return not self.observations.y and not self.observations.my and not self.observations.oy


def record_workload(rec, workload: Workload, studies: dict | None) -> Workload:
    """The workload a stored trial ran: `workload` at the trial's node count, and its study's global
    batch, precision and framework (each trial is a residual of the model in its own workload)."""
    gb, precision, framework = getattr(rec, "global_batch", None), None, workload.framework
    if studies and getattr(rec, "study", None) in studies:
        st = studies[rec.study]
        gb = gb or st.global_batch
        precision = (st.workload or {}).get("precision")
        framework = stored_framework(st.workload)
    return replace(workload, nodes=int(rec.nodes), global_batch=int(gb or workload.global_batch),
                   precision=precision or "bf16", framework=framework)


def simulated(rec, studies: dict | None = None) -> bool:
    """Whether a stored trial's (or a study's) numbers are the simulator's -- the model's own prediction, not
    a measurement: its runner says so, or its study's (`studies`: name -> StudyRecord) does."""
    if (getattr(rec, "runner", "") or "") in SIMULATED:
        return True
    st = (studies or {}).get(getattr(rec, "study", None))
    return st is not None and (getattr(st, "runner", "") or "") in SIMULATED


def left_out(rec, workload: Workload, studies: dict | None) -> str | None:
    """Why a stored trial is no evidence for `workload` ("simulated", "framework", "other": another model
    or cluster, a status that says nothing, another GPU count), or None when it is."""
    if (getattr(rec, "model", workload.model.name) != workload.model.name
            or getattr(rec, "cluster", workload.cluster.name) != workload.cluster.name
            or rec.status not in (Status.OK, Status.OOM, Status.STOPPED)):
        return "other"
    if simulated(rec, studies):
        return "simulated"
    if record_workload(rec, workload, studies).framework != workload.framework:
        return "framework"
    return None


def warm_start_records(records, workload: Workload, studies: dict | None = None) -> WarmStart:
    """Observations from stored trials (TrialRecord-like: layout, status, mfu, peak_memory_gb, model, cluster,
    nodes, study, runner) of `workload`'s model, cluster and framework at any node count, measured ones only
    (a simulated trial is the model's own prediction). `studies` (name -> StudyRecord) supplies each study's
    global batch, precision, framework and runner; without it the workload's are assumed. Evidence: studies,
    node counts, trials used, the mean residual log(measured/predicted), and the simulated trials and the
    other frameworks' trials left out."""
    obs = Observations()
    used: list = []
    skipped = {"simulated": 0, "framework": 0}
    cap = workload.cluster.memory_gb
    for rec in records or ():
        why = left_out(rec, workload, studies)
        if why in skipped:
            skipped[why] += 1
        if why:
            continue
        w = record_workload(rec, workload, studies)
        lay = rec.layout
        if lay.gpus != w.gpus or (rec.status in (Status.OK, Status.STOPPED) and not rec.mfu):
            continue
        ft = features(lay, w)
        n_time = len(obs.y)
        obs.add_result(ft, rec.status, rec.mfu, rec.peak_memory_gb, cap, HISTORY_NOISE,
                       getattr(rec, "peak_reserved_gb", None))
        used.append((rec, obs.y[-1] if len(obs.y) > n_time else None))
    res = [r for _, r in used if r is not None]
    evidence = {"studies": sorted({getattr(r, "study", "") for r, _ in used}),
                "node_counts": sorted({int(r.nodes) for r, _ in used}),
                "trials": len(used), "ok_trials": len(res), "oom_trials": sum(r.status == Status.OOM for r, _ in used),
                "mean_residual": float(np.mean(res)) if res else 0.0,
                "mean_ratio": float(math.exp(np.mean(res))) if res else 1.0,
                "simulated_trials": skipped["simulated"], "other_framework_trials": skipped["framework"]}
    return WarmStart(obs, evidence)
