"""compare's rounds: each problem's rows timed several times in turn, each row's median round kept."""

import subprocess
import sys

import pytest

import harness
from harness.model.timing import round_order
from harness.run.compare import _median_round
from harness.run.results import Row

pytestmark = pytest.mark.usefixtures("forget_user_kernels")  # each test's kernels leave with it


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd)


def _row(name: str, status: str = "ok", median_s: float | None = 1.0) -> Row:
    return Row(name, "c", "cpu", "8x8x8", "float32", status=status, median_s=median_s)


def test_rounds_give_one_checked_and_timed_row_per_implementation():
    results = harness.compare([16], ["c.naive_ikj", "numpy.matmul"], baselines=False, min_time=0.01, rounds=3)
    assert [row.implementation for row in results.rows] == ["c.naive_ikj", "numpy.matmul"]
    assert all(row.passed and row.median_s > 0 for row in results.rows), [row.status for row in results.rows]
    assert results.settings["rounds"] == 3
    assert "median of 3 rounds" in str(results)  # the table says so
    once = harness.compare([8], ["c.naive_ikj"], baselines=False, min_time=0.01)
    assert "rounds" not in once.settings and "rounds" not in str(once)


def test_rounds_keep_a_decode_problems_rows_in_place():
    results = harness.compare(
        ["1x64x256"], ["c.decode_int8"], weights=["q8_0", "q4_0"], baselines=False, min_time=0.01, rounds=2
    )
    assert [(row.implementation, row.weights) for row in results.rows] == [
        ("c.decode_int8", "q8_0"),
        ("c.decode_int8", "q4_0"),
    ]
    assert all(row.passed for row in results.rows), [row.status for row in results.rows]


def test_a_row_that_fails_in_the_first_round_is_not_run_again(tmp_path):
    calls = tmp_path / "calls"
    source = tmp_path / "mine.py"
    source.write_text(
        "def broken(a, b):\n"
        f"    with open({str(calls)!r}, 'a') as log:\n"
        "        log.write('call\\n')\n"
        "    raise RuntimeError('not written yet')\n"
    )
    results = harness.compare([8], [f"{source}:broken"], baselines=False, min_time=0.01, rounds=3)
    (row,) = results.rows
    assert row.status == "error: RuntimeError: not written yet"
    assert calls.read_text().count("call") == 1


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_each_round_is_an_order_of_all_rows_and_no_row_always_comes_right_after_the_same_one(count):
    orders = [round_order(count, index) for index in range(3)]
    assert all(sorted(order) == list(range(count)) for order in orders)
    for row in range(count):
        before = {order[order.index(row) - 1] if order.index(row) else None for order in orders}
        assert len(before) > 1, (row, orders)


def test_the_median_round_is_kept_and_a_fault_in_any_round_wins():
    rounds = [_row("x", median_s=3.0), _row("x", median_s=1.0), _row("x", median_s=2.0)]
    assert _median_round(rounds).median_s == 2.0
    assert _median_round(rounds + [_row("x", median_s=4.0)]).median_s == 2.0  # the lower middle
    failed = _row("x", status="FAILED: wrong", median_s=None)
    assert _median_round([rounds[0], failed, rounds[1]]) is failed
    untimed = _row("x", median_s=None)  # a stand-in: checked, never timed
    assert _median_round([rounds[0], untimed]) is untimed


@pytest.mark.parametrize("rounds", [0, -1, 1.5, True, "3"])
def test_a_bad_rounds_is_refused(rounds):
    with pytest.raises(ValueError, match="rounds must be a whole number >= 1"):
        harness.compare([8], ["c.naive_ikj"], baselines=False, rounds=rounds)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_bad_rounds_is_a_usage_error(tmp_path, value):
    done = run_cli("compare", "--shapes", "8", "--impls", "c.naive_ikj", "--rounds", value, cwd=tmp_path)
    assert done.returncode == 2 and "--rounds" in done.stderr and "Traceback" not in done.stderr
