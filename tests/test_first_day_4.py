"""A first day without surprises, part 4 (task R, session 14): what a new user met on a fresh clone, one test each."""

from __future__ import annotations

import sys


def one_line_error(tuner, *args) -> str:
    code, out, err = tuner(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, err)
    return err


def test_a_tp_that_divides_no_gpu_count_names_the_fix_not_dp(tuner):
    err = one_line_error(tuner, "predict", "--model", "tiny", "--nodes", "2", "--tp", "3", "--pp", "1",
                         "--micro-batch", "1")
    assert "tp*cp*pp = 3 does not divide 16 GPUs" in err and "pick --tp, --cp and --pp" in err, err
    assert "pass --dp" not in err              # no --dp makes 3 x dp = 16: the old hint sent users round in a loop


def test_plan_names_the_degree_none_of_whose_choices_divides_the_gpus(tuner):
    err = one_line_error(tuner, "plan", "--model", "tiny", "--nodes", "2", "--tp", "3")
    assert "no tp among the space's choices (3) divides 16 GPUs: pick a --tp that does" in err, err
    err = one_line_error(tuner, "plan", "--model", "tiny", "--nodes", "1", "--pp", "3")
    assert "no pp among the space's choices (3) divides 8 GPUs: pick a --pp that does" in err, err


def test_resume_says_which_store_and_never_creates_one(tuner, tmp_path):
    err = one_line_error(tuner, "resume", "my-study")
    assert f"no results store at sqlite:///{tmp_path / 'tuner.db'}" in err, err
    assert not (tmp_path / "tuner.db").exists()            # a resume in the wrong directory leaves no empty store
    assert tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "2", "--study", "s")[0] == 0
    code, out, err = tuner("resume", "s", "--budget", "3")
    assert code == 0 and f"store: {tuner.db}" in err.splitlines()[0], err
    assert "study s: 1 trial(s) ran" in out, out
    code, out, err = tuner("resume", "ghost")
    assert code == 2 and err.splitlines() == [f"store: {tuner.db}", "error: no study named 'ghost'; known studies: s"]


def test_csv_listings_end_with_their_last_row_not_a_blank_line(tuner):
    assert tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "2", "--study", "s")[0] == 0
    for args in (("trials", "s"), ("studies",), ("plan", "--model", "tiny", "--nodes", "1", "--top", "2")):
        code, out, err = tuner(*args, "--format", "csv")
        assert code == 0 and out.endswith("\n") and not out.endswith("\n\n"), (args, out[-40:])
        assert "" not in out.splitlines(), args                  # csv.reader would read a blank line as a row []


def test_a_config_file_that_is_not_utf8_says_so_and_how_to_fix_it(tuner, tmp_path):
    (tmp_path / "study.toml").write_bytes(b'model = "tiny"\nnodes = 1\n# caf\xe9 (latin-1)\n')
    err = one_line_error(tuner, "search", "--config", "study.toml")
    assert "--config study.toml is not UTF-8 text (invalid continuation byte at byte 30)" in err, err
    assert "save it as UTF-8, or write one with `tuner config NAME > study.toml`" in err, err


def test_export_into_a_missing_directory_or_under_a_file_names_which_and_the_fix(tuner, tmp_path):
    assert tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--study", "s")[0] == 0
    (tmp_path / "afile").write_text("x")
    code, out, err = tuner("export", "s", "--format", "csv", "--out", "afile/t.csv")
    assert code == 2 and err.splitlines()[-1] == ("error: --out afile/t.csv: a part of the path is a file, not a "
                                                  "directory (afile): choose another --out"), err
    code, out, err = tuner("export", "s", "--format", "csv", "--out", "no/such/t.csv")
    assert code == 2 and err.splitlines()[-1] == ("error: --out no/such/t.csv: directory no/such does not exist: "
                                                  "create it, or choose another --out"), err


def test_a_measured_mfu_above_100_percent_says_the_clusters_peak_is_too_low(tuner, tmp_path):
    (tmp_path / "fast.py").write_text("import json, os\njson.dump({'status': 'ok', 'samples_per_second': 1e9, "
                                      "'peak_memory_gb': 1.0}, open(os.environ['TUNER_RESULT_JSON'], 'w'))\n")
    code, out, err = tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--runner", "command",
                           "--command", f"{sys.executable} fast.py", "--study", "s")
    assert code == 0 and "recommended:" in out, err
    assert "faster than cluster frontier's peak_tflops (191.5 TFLOPS per GPU) allows: that peak is too low" in err, err
    (tmp_path / "fast.py").write_text((tmp_path / "fast.py").read_text().replace("1e9", "1e-3"))
    code, out, err = tuner("search", "--model", "tiny", "--nodes", "1", "--budget", "1", "--runner", "command",
                           "--command", f"{sys.executable} fast.py", "--study", "t")
    assert code == 0 and "recommended:" in out and "peak is too low" not in err, err
