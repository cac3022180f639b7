"""The correction tells layouts that offload different numbers of layers apart (issue 30 round 43: z's offloading
coordinate, tuner.offload.offload_share): the model prices them alike where it hides the copies, and two measured
twins 8 % apart were one point to the correction before."""

from __future__ import annotations

import dataclasses
import math

from tuner.correction import Observations, features
from tuner.offload import offload_share
from tuner.perfmodel import predict
from tuner.space import load_space
from tuner.specs import make_workload

W = make_workload("22b", 2, "frontier", framework="megatron-core")
BASE = next(c for c in load_space("default").enumerate_layouts(W) if c.key() == "tp1-pp1-dp16-mb2-z3-rcnone")
OFF24, OFF36 = (dataclasses.replace(BASE, offload_layers=n) for n in (24, 36))


def test_the_share_runs_from_none_to_all_layers():
    assert offload_share(dataclasses.replace(OFF24, offload_layers=0), W) == 0.0
    assert offload_share(OFF24, W) == 24 / W.model.num_layers < offload_share(OFF36, W) <= 1.0


def test_twins_the_model_prices_alike_are_told_apart_once_both_ran():
    p24, p36 = predict(OFF24, W), predict(OFF36, W)
    assert p24.mfu == p36.mfu                                   # the copies hidden under compute: the same price
    f24, f36 = features(OFF24, W, p24), features(OFF36, W, p36)
    assert (f24.z != f36.z).any()
    obs = Observations()
    obs.add_time(f24, p24.mfu, 0.02)
    obs.add_time(f36, 0.92 * p36.mfu, 0.02)                     # a machine on which 36 offloaded layers cost 8 %
    mu, _ = obs.time_gp().predict([f24.z, f36.z], [f24.f, f36.f])
    assert mu[0] - mu[1] > 0.5 * -math.log(0.92)                # the correction keeps most of the measured gap
