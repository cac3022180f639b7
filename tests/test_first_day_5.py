"""A first day without surprises, part 5 (task H, session 16): what a new user met on a fresh clone, one test each."""

from __future__ import annotations


def one_line_error(tuner, *args) -> str:
    code, out, err = tuner(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, err)
    return err


def test_a_store_that_is_a_directory_names_a_file_in_it(tuner, tmp_path, monkeypatch):
    folder = tmp_path / "store"
    folder.mkdir()
    url = f"sqlite:///{folder}"
    fix = f"is a directory, not a SQLite file: point --db or TUNER_DB at a file, e.g. --db sqlite:///{folder / 'tuner.db'}"
    # a writing command (SQLite said 'unable to open database file', exit 1), a reading one ('disk I/O error')
    # and the schema upgrade, by --db and by TUNER_DB
    for args in (("search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--db", url), ("studies", "--db", url),
                 ("db", "upgrade", "--db", url)):
        assert fix in one_line_error(tuner, *args)
    monkeypatch.setenv("TUNER_DB", url)
    assert fix in one_line_error(tuner, "trials", "s")
    assert list(folder.iterdir()) == []


def test_a_store_that_is_not_a_sqlite_file_says_so_and_keeps_the_file(tuner, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("trial,samples_s\n1,16.9\n")
    url = f"sqlite:///{notes}"
    fix = "is not a SQLite database (the file does not start with SQLite's header): point --db or TUNER_DB at"
    # studies said 'internal error: DatabaseError: file is not a database' (exit 1); search 'failed while opening it'
    assert fix in one_line_error(tuner, "studies", "--db", url)
    assert fix in one_line_error(tuner, "search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--db", url)
    assert notes.read_text() == "trial,samples_s\n1,16.9\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]   # no -wal / -shm beside it
    empty = tmp_path / "new.db"                                           # an empty file is an empty SQLite database
    empty.write_bytes(b"")
    assert tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--db", f"sqlite:///{empty}")[0] == 0


def error_line(tuner, *args) -> str:
    """The error line of a command that may first say which store it read (launch: 'note: no results store')."""
    code, out, err = tuner(*args)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and "Traceback" not in err and lines[-1].startswith("error: "), (code, err)
    assert all(ln.startswith(("note: no results store", "store: ")) for ln in lines[:-1]), err
    return lines[-1]


def test_a_bad_launch_account_or_time_names_the_flag_not_the_cluster_file(tuner):
    base = ("launch", "--model", "tiny", "--nodes", "1", "--out", "l/", "--train-iters", "10", "--mock-data",
            "--framework", "megatron-core")
    # before: "cluster 'local' [slurm]: slurm key 'account' has characters ..." -- a key the user never wrote there
    err = error_line(tuner, *base, "--account", "my project")
    assert err.startswith("error: --account 'my project' has characters sbatch would misread") and "[slurm]" not in err
    err = error_line(tuner, *base, "--partition", "gpu;rm")
    assert err.startswith("error: --partition 'gpu;rm' has characters sbatch would misread"), err
    err = error_line(tuner, *base, "--time", "2h")
    assert err.startswith("error: --time '2h' is not a Slurm time limit: give minutes (90) or [D-]HH:MM[:SS]"), err
    code, _, err = tuner(*base, "--account", "abc123", "--time", "02:00:00")
    assert code == 0, err
    text = open("l/launch.sbatch").read()
    assert "#SBATCH --account=abc123" in text and "#SBATCH --time=02:00:00" in text


def test_ctrl_c_while_a_study_is_set_up_names_the_resume(tuner, monkeypatch):
    # Ctrl-C after the study is stored but before the driver's loop (the guided searcher builds its candidates
    # for about a second): the CLI said 'interrupted' alone, so nobody knew a study named s existed
    import tuner.study as studies

    real = studies.run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(studies, "run", interrupted)
    code, out, err = tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "2", "--study", "s")
    assert code == 130 and "Traceback" not in err, (code, err)
    assert err.strip().splitlines()[-1] == ("error: interrupted while study s was being set up (no trial running); "
                                            "continue with `tuner resume s`"), err
    monkeypatch.setattr(studies, "run", real)
    code, out, err = tuner("resume", "s")
    assert code == 0 and "study s: 2 trial(s) ran" in out, (code, out, err)


def test_a_rocm_launch_says_primus_variables_are_exported_only_where_some_are():
    # an MI355X (gfx950) on one node exports none of them; its script said "Variables from AMD's Primus recipes are
    # exported below." above a block with none
    from tuner.layout import Layout
    from tuner.render.launch import launch_files
    from tuner.specs import make_workload

    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, zero_stage=1)
    script = launch_files(lay, make_workload("llama3-8b", 1, "mi355x", framework="megatron-core"),
                          framework="megatron-core", train_iters=10, mock_data=True)["launch.sbatch"]
    assert "exported below" not in script and "none is exported" in script
    assert "HSA_NO_SCRATCH_RECLAIM=" not in script and "NCCL_IB_GID_INDEX=" not in script
    lay = Layout(tp=1, pp=1, dp=16, micro_batch=1, zero_stage=1)
    script = launch_files(lay, make_workload("llama3-8b", 2, "mi300x", framework="megatron-core"),
                          framework="megatron-core", train_iters=10, mock_data=True)["launch.sbatch"]
    assert "exported below" in script and "export HSA_NO_SCRATCH_RECLAIM=1" in script


def test_a_file_named_results_where_the_default_store_goes_names_the_fix(tuner, tmp_path, monkeypatch):
    # 'internal error: FileExistsError: [Errno 17] File exists: 'results'' (exit 1) before
    monkeypatch.delenv("TUNER_DB")
    (tmp_path / "results").write_text("x\n")
    err = one_line_error(tuner, "search", "--model", "tiny", "--nodes", "1", "--budget", "1")
    assert f"needs a directory 'results' here, and {tmp_path / 'results'} is a file: move it, or choose" in err, err
    assert (tmp_path / "results").read_text() == "x\n"


def test_several_node_counts_to_a_one_count_command_name_the_commands_that_take_them(tuner):
    # 'tuner best --nodes 2,4' said "'2,4' is not a valid integer range": a range is what the user gave
    fix = "this command answers one node count (e.g. 8); for several (2,4 or 2:8) use `tuner scale --nodes` or"
    for args in (("best", "--model", "tiny", "--nodes", "2,4"), ("plan", "--model", "tiny", "--nodes", "1:4"),
                 ("predict", "--model", "tiny", "--nodes", "1,2", "--tp", "1", "--pp", "1", "--micro-batch", "1"),
                 ("launch", "--model", "tiny", "--nodes", "1,2", "--out", "l/", "--train-iters", "1", "--mock-data")):
        assert fix in one_line_error(tuner, *args), args
    assert "'abc' is not a valid integer." in one_line_error(tuner, "plan", "--model", "tiny", "--nodes", "abc")
    assert "0 is not in the range x>=1" in one_line_error(tuner, "best", "--model", "tiny", "--nodes", "0")
    assert tuner("plan", "--model", "tiny", "--nodes", "1", "--top", "1")[0] == 0


def test_a_hugging_face_config_without_architectures_is_refused_in_words(tuner, tmp_path):
    # the refusal read "config.json: ? (model_type 'llama') lacks ..." where the config lists no architectures
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "llama", "hidden_size": 4096}')
    err = one_line_error(tuner, "predict", "--model", str(tmp_path / "hf"), "--seq-length", "4096", "--global-batch",
                         "64", "--nodes", "1", "--cluster", "h100", "--tp", "1", "--pp", "1", "--micro-batch", "1")
    assert "config.json: a config that names no architecture (model_type 'llama') lacks num_hidden_layers" in err, err
    assert " ? " not in err


def test_the_library_scale_takes_the_price_as_docs_library_md_shows_it():
    # docs/library.md's tuner.scale(..., price=2.5) raised "TypeError: 'float' object is not iterable"
    import pytest

    import tuner
    from tuner.errors import UsageError

    rows = tuner.scale(model="tiny", cluster="frontier,h100", nodes="1,2", tokens=1e9, price=2.5, jobs=1).rows
    assert len(rows) == 4 and all(abs(r["cost"] - 2.5 * r["gpu_hours"]) < 1e-6 for r in rows)
    rows = tuner.scale(model="tiny", cluster="frontier,h100", nodes="1", tokens=1e9, jobs=1,
                       price={"frontier": 1.8, "h100": 2.5}).rows
    assert {r["cluster"]: round(r["cost"] / r["gpu_hours"], 6) for r in rows} == {"frontier": 1.8, "h100": 2.5}
    with pytest.raises(UsageError, match="has no price for frontier"):
        tuner.scale(model="tiny", cluster="frontier,h100", nodes="1", tokens=1e9, price={"h100": 2.5}, jobs=1)


def test_a_torchtitan_mock_data_launch_says_where_it_reads_the_test_set(tuner):
    # the Megatron launches say pretrain_gpt.py is taken from a checkout beside the files; torchtitan's --mock-data
    # reads torchtitan/tests/assets there (a pip-installed torchtitan has none) and said nothing
    base = ("launch", "--model", "llama3-8b", "--cluster", "h100", "--nodes", "1", "--framework", "torchtitan",
            "--train-iters", "10", "--mock-data")
    code, out, err = tuner(*base, "--out", "a/")
    assert code == 0, err
    assert ("note: --mock-data reads torchtitan's c4_test set and test tokenizer from torchtitan/tests/assets beside "
            "the files (a torchtitan checkout): pass --megatron-dir to point at yours") in err, err
    assert 'dataset_path = "torchtitan/tests/assets/c4_test"' in open("a/torchtitan.toml").read()
    code, out, err = tuner(*base, "--out", "b/", "--megatron-dir", "/opt/torchtitan")
    assert code == 0 and "tests/assets beside" not in err, err
    assert 'dataset_path = "/opt/torchtitan/tests/assets/c4_test"' in open("b/torchtitan.toml").read()


def test_a_store_path_under_a_file_names_the_file_not_a_missing_directory(tuner, tmp_path):
    # 'directory afile does not exist; create it' for --db sqlite:///afile/tuner.db with afile a file (it exists)
    (tmp_path / "afile").write_text("x\n")
    for url in ("sqlite:///afile/tuner.db", "sqlite:///afile/sub/tuner.db"):
        err = one_line_error(tuner, "search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--db", url)
        assert "a part of the path is a file, not a directory (afile): point --db / TUNER_DB at another" in err, err
    err = one_line_error(tuner, "search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--db", "sqlite:///no/t.db")
    assert "directory no does not exist; create it" in err, err


def test_a_listing_whose_reader_went_away_exits_0(tuner, monkeypatch):
    # 'tuner plan ... | head -2' exited 1 without a word about one run in two: click's own handler of a closed pipe
    # (errno EPIPE) runs before main()'s, which says exit 0 ("the reader went away: the work itself is done")
    import errno

    import click

    def closed(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(click, "echo", closed)
    code, out, err = tuner("plan", "--model", "tiny", "--nodes", "1", "--top", "2")
    assert code == 0 and "Traceback" not in err, (code, err)
