"""The study's options are declared once (tuner.study_options, issue 29): `tuner search`'s click options
and the library's checks (tuner.config, tuner.create_study) are the same parameters."""

from __future__ import annotations

import pytest

from tuner import config
from tuner.cli.study import search
from tuner.errors import UsageError
from tuner.study_options import params


def _shape(p):
    return (p.name, tuple(p.opts), tuple(p.secondary_opts), repr(p.type), p.default, p.required, p.help,
            p.show_default, p.is_flag)


def test_the_command_and_the_library_read_the_same_declarations():
    command = {p.name: p for p in search.params if p.name not in ("config", "db", "fmt", "activation_checkpointing")}
    library = params()
    assert set(command) == set(library) and {"model", "budget", "stop_threshold", "tp", "recompute"} <= set(library)
    assert [_shape(command[k]) for k in sorted(command)] == [_shape(library[k]) for k in sorted(library)]


def test_a_keyword_is_refused_with_the_flag_s_words():
    with pytest.raises(UsageError, match=r"^study settings: budget = 0: Invalid value for '--budget': 0 is not in the range x>=1.$"):
        config.check({"model": "tiny", "budget": 0})
    with pytest.raises(UsageError, match=r"unknown key\(s\) bogus; valid keys: .*budget"):
        config.check({"bogus": 1})
    assert config.check({"ep": "2", "budget": "7"}) == {"expert_parallel": 2, "budget": 7}
