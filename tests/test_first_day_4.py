"""A first day without surprises, part 4 (task R, session 14): what a new user met on a fresh clone, one test each."""

from __future__ import annotations


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
