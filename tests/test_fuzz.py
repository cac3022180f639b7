"""Bad input everywhere (issue 8, item 4): random model/cluster TOML and random layouts through
`tuner predict`, `tuner plan` and `tuner search --budget 3`.

Property: the command never crashes. It succeeds (exit 0), or it fails with one line `error: ...` and
exit status 2 -- no traceback, no "internal error" -- and a failed search writes nothing to the store.
The generated inputs start from a valid preset and break one to three things (a key removed, added,
retyped, made negative, zero, huge, unicode, NaN...), so both the valid and the invalid paths run.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from tuner.cli import main
from tuner.store import open_store

EXAMPLES = int(os.environ.get("TUNER_FUZZ_EXAMPLES", "50"))
PER_RUN_S = 30          # one command may take this long before it counts as a hang

BASE_MODEL = {"name": "tiny", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
              "vocab_size": 512, "global_batch": 16}
BASE_CLUSTER = {"name": "local", "gpus_per_node": 2, "peak_tflops": 0.05, "memory_gb": 8.0,
                "hbm_bandwidth_gbps": 10.0, "intra_node_bandwidth_gbps": 2.0, "inter_node_bandwidth_gbps": 1.25,
                "matmul_efficiency": 0.5, "memory_reserved_gb": 0.5, "flash_attention": False}
BIG_MODEL = {"name": "gpt-22b", "num_layers": 48, "hidden_size": 6144, "num_attention_heads": 48,
             "seq_length": 2048, "vocab_size": 50688, "global_batch": 640}
BIG_CLUSTER = {"name": "frontier", "gpus_per_node": 8, "peak_tflops": 191.5, "memory_gb": 64.0,
               "hbm_bandwidth_gbps": 1600.0, "intra_node_bandwidth_gbps": 50.0, "inter_node_bandwidth_gbps": 100.0}

# ---- values -------------------------------------------------------------------------------------
INT64 = 2**63 - 1
ints = st.one_of(st.integers(-3, 64), st.sampled_from([0, -1, 2**31, 2**40, INT64, -INT64 - 1]),
                 st.integers(-INT64 - 1, INT64))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e308, 1e-308, 1.5]))
text = st.text(max_size=40)
scalars = st.one_of(ints, floats, text, st.booleans())
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=8), scalars, max_size=3))
keys = st.one_of(st.sampled_from(list(BASE_MODEL) + list(BASE_CLUSTER) + ["slurm", "group_bandwidth_gbps",
                                                                        "ffn_hidden_size", "latency_us"]),
                 st.text(min_size=1, max_size=20))


@st.composite
def spec(draw, bases):
    """A spec dict: a valid base with 0-3 mutations (drop / set / retype a key)."""
    d = dict(draw(st.sampled_from(bases)))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        kind = draw(st.sampled_from(["drop", "set", "set", "bump"]))
        if kind == "drop" and d:
            d.pop(draw(st.sampled_from(sorted(d))))
        elif kind == "set":
            d[draw(keys)] = draw(values)
        elif kind == "bump" and d:
            k = draw(st.sampled_from(sorted(d)))
            if isinstance(d[k], (int, float)) and not isinstance(d[k], bool):
                d[k] = type(d[k])(d[k] * draw(st.sampled_from([-1, 0, 3, 1000, 10**6])))
    return d


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)    # a TOML basic string (or, rarely, malformed TOML)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(d: dict) -> str:
    return "".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}\n" for k, v in d.items())


raw_files = st.one_of(st.binary(max_size=60), st.text(max_size=60).map(lambda s: s.encode("utf-8", "replace")),
                      st.just(b"name = \"x\"\nname = \"y\"\n"), st.just(b"\xff\xfe = 1\n"))
PAIRS = [(BASE_MODEL, BASE_CLUSTER), (BIG_MODEL, BIG_CLUSTER), (BASE_MODEL, BIG_CLUSTER)]


@st.composite
def spec_files(draw) -> tuple[bytes, bytes]:
    """(model TOML, cluster TOML): a matched valid pair, mutated; now and then a garbage file instead."""
    model, cluster = draw(st.sampled_from(PAIRS))
    m = to_toml(draw(spec([model]))).encode()
    c = to_toml(draw(spec([cluster]))).encode()
    garbage = draw(st.sampled_from([None, None, None, None, "model", "cluster"]))
    if garbage == "model":
        m = draw(st.one_of(raw_files, st.sampled_from([b"", b"[model]\nname=1"])))
    elif garbage == "cluster":
        c = draw(raw_files)
    return m, c


cli_ints = st.one_of(st.integers(-2, 20), st.sampled_from([0, -1, 2**31, 10**12, 10**30]))
node_counts = st.one_of(st.integers(1, 4), st.integers(1, 4), cli_ints)


# ---- running the CLI ----------------------------------------------------------------------------
class Hang(BaseException):
    """Raised by the alarm: the command ran past PER_RUN_S (main() does not catch BaseException)."""


def _alarm(signum, frame):
    raise Hang(f"the command ran past {PER_RUN_S} s")


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_RUN_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


def assert_clean(args, code: int, out: str, err: str) -> None:
    shown = f"tuner {' '.join(args)} -> {code}\nstdout: {out[-500:]}\nstderr: {err[-1500:]}"
    event(f"exit {code}")
    assert "Traceback" not in err and "internal error" not in err, shown
    assert code in (0, 2), shown
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), shown


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="tuner-fuzz-") as d:
        old = os.getcwd()
        os.chdir(d)                     # trial dirs and default paths land here
        try:
            yield Path(d)
        finally:
            os.chdir(old)


def write(work: Path, name: str, data: bytes) -> str:
    p = work / name
    p.write_bytes(data)
    return str(p)


def counts(db: str) -> tuple[int, int]:
    with open_store(db) as s:
        names = s.study_names()
        return len(names), sum(len(s.trials(n)) for n in names)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


@FUZZ
@given(files=spec_files(), nodes=node_counts, tp=cli_ints, pp=cli_ints, mb=cli_ints,
       dp=st.none() | cli_ints, zero=st.none() | cli_ints, gb=st.none() | cli_ints)
def test_predict_never_crashes(work, files, nodes, tp, pp, mb, dp, zero, gb):
    model, cluster = files
    args = ["predict", "--model", write(work, "m.toml", model), "--cluster", write(work, "c.toml", cluster),
            "--nodes", str(nodes), "--tp", str(tp), "--pp", str(pp), "--micro-batch", str(mb), "--format", "json"]
    args += ["--dp", str(dp)] if dp is not None else []
    args += ["--zero-stage", str(zero)] if zero is not None else []
    args += ["--global-batch", str(gb)] if gb is not None else []
    code, out, err = run_cli(*args)
    assert_clean(args, code, out, err)
    if code == 0:
        json.loads(out)


@FUZZ
@given(files=spec_files(), nodes=node_counts, gb=st.none() | cli_ints)
def test_plan_never_crashes(work, files, nodes, gb):
    model, cluster = files
    args = ["plan", "--model", write(work, "m.toml", model), "--cluster", write(work, "c.toml", cluster),
            "--nodes", str(nodes), "--top", "3", "--format", "json"]
    args += ["--global-batch", str(gb)] if gb is not None else []
    code, out, err = run_cli(*args)
    assert_clean(args, code, out, err)
    if code == 0:
        assert json.loads(out)


_n = iter(range(10**9))


@FUZZ
@given(files=spec_files(), nodes=st.one_of(st.integers(-1, 4), st.sampled_from([10**6])), gb=st.none() | cli_ints)
def test_search_never_crashes_and_failures_write_nothing(work, files, nodes, gb):
    model, cluster = files
    db = f"sqlite:///{work / 'fuzz.db'}"
    before = counts(db)
    study = f"fuzz-{next(_n)}"
    args = ["search", "--model", write(work, "m.toml", model), "--cluster", write(work, "c.toml", cluster),
            "--nodes", str(nodes), "--budget", "3", "--searcher", "random", "--db", db, "--study", study,
            "--format", "json"]
    args += ["--global-batch", str(gb)] if gb is not None else []
    code, out, err = run_cli(*args)
    assert_clean(args, code, out, err)
    after = counts(db)
    if code != 0:
        assert after == before, f"a failed search wrote to the store: {before} -> {after}\n{err}"
    else:
        assert after[0] == before[0] + 1 and json.loads(out)["study"] == study


@FUZZ
@given(layout=st.fixed_dictionaries({k: cli_ints for k in ("tp", "pp", "dp", "micro_batch")},
                                    optional={"zero_stage": cli_ints, "activation_checkpointing": st.booleans(),
                                              "context_parallel": cli_ints, "virtual_pipeline": cli_ints,
                                              "sequence_parallel": st.booleans(),
                                              "recompute": st.sampled_from(["none", "selective", "full"])}),
       preset=st.sampled_from([("175b", "16", "frontier"), ("22b", "2", "frontier"), ("tiny", "1", "local")]))
def test_random_layouts_on_presets(work, layout, preset):
    """Random layouts on real presets: valid ones predict, invalid ones name the rule they break."""
    model, nodes, cluster = preset
    args = ["predict", "--model", model, "--nodes", nodes, "--cluster", cluster, "--tp", str(layout["tp"]),
            "--pp", str(layout["pp"]), "--dp", str(layout["dp"]), "--micro-batch", str(layout["micro_batch"])]
    if "zero_stage" in layout:
        args += ["--zero-stage", str(layout["zero_stage"])]
    if layout.get("activation_checkpointing") is False:
        args.append("--no-activation-checkpointing")
    for key, flag in (("context_parallel", "--cp"), ("virtual_pipeline", "--vp"), ("recompute", "--recompute")):
        if key in layout:
            args += [flag, str(layout[key])]
    if "sequence_parallel" in layout:
        args.append("--sequence-parallel" if layout["sequence_parallel"] else "--no-sequence-parallel")
    code, out, err = run_cli(*args)
    assert_clean(args, code, out, err)
