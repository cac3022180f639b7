"""`tuner scale` (issue 27): goodput, the scaling table, its pictures, its library call."""

from __future__ import annotations

import math

import pytest

from tuner.errors import SpecError
from tuner.goodput import DEFAULTS, daly_interval, goodput, operation, wall_fraction
from tuner.specs import ClusterSpec, load_cluster, load_model
from tuner.presets import read_toml, find_spec_file


# ------------------------------------------------------------------------------------------------ goodput

def test_daly_interval_is_youngs_to_first_order_and_minimises_the_wall_time():
    delta, mtbf = 60.0, 3600.0 * 4
    tau = daly_interval(delta, mtbf)
    young = math.sqrt(2 * delta * mtbf)
    assert abs(tau - young) / young < 0.05
    best = wall_fraction(tau, delta, 600.0, mtbf)
    for other in (0.5 * tau, 0.8 * tau, 1.25 * tau, 2 * tau):     # Daly's optimum beats its neighbours
        assert wall_fraction(other, delta, 600.0, mtbf) < best
    assert daly_interval(3 * mtbf, mtbf) == mtbf                  # delta >= 2M: checkpoint every MTBF


def test_goodput_falls_with_nodes_and_failures_per_day_follow_the_mtbf():
    m, c = load_model("llama3-405b"), load_cluster("h100")
    small, large = (goodput(m.num_parameters, "megatron-core", c, n) for n in (64, 2048))
    mtbf = DEFAULTS["node_mtbf_hours"][0]
    assert large.failures_per_day == pytest.approx(24 * 2048 / mtbf)
    assert 0 < large.fraction < small.fraction < 1
    assert large.checkpoint_gb == pytest.approx(m.num_parameters * 14 / 1e9)
    assert large.write_s == pytest.approx(large.checkpoint_gb / DEFAULTS["filesystem_bandwidth_gbps"][0])
    # Meta reports > 90 % effective training time for this run (Llama 3 paper sec. 3.3.4): the model agrees
    assert 0.9 < large.fraction < 0.97


def test_a_cluster_file_gives_its_own_operations_and_bad_ones_are_refused(tmp_path):
    data = read_toml(find_spec_file("clusters", "h100"))
    c = ClusterSpec.from_dict({**data, "operations": {"node_mtbf_hours": 1000.0, "node_power_kw": 9}})
    assert operation(c, "node_mtbf_hours") == (1000.0, "cluster h100's [operations]")
    assert operation(c, "node_power_kw")[0] == 9.0
    assert operation(load_cluster("h100"), "node_power_kw")[0] == 10.2          # the preset's published figure
    assert operation(load_cluster("mi300x"), "node_power_kw")[0] is None        # nobody's figure: no energy
    assert "operations" not in load_cluster("h100").as_dict()                    # stored as before when absent
    with pytest.raises(SpecError, match="unknown \\[operations\\] key 'mtbf'"):
        ClusterSpec.from_dict({**data, "operations": {"mtbf": 3}})
    with pytest.raises(SpecError, match="must be a number > 0"):
        ClusterSpec.from_dict({**data, "operations": {"node_mtbf_hours": -1}})
