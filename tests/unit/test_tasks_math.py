"""The math verifier: boxed-answer extraction, equivalence, and the killable worker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmrl.tasks.math import (
    MAX_ANSWER_CHARS,
    answers_match,
    extract_answer,
    ground_truths,
    verify_math,
)

# --- extraction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"\boxed{1} or rather \boxed{2}", "2"),
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{{a}^{b_{c}}}", r"{a}^{b_{c}}"),
        (r"\boxed {7}", "7"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"<think>maybe \boxed{3}</think> it is \boxed{4}", "4"),
        (r"<think>\boxed{3}</think><think>\boxed{5}</think>final \boxed{6}", "6"),
        (r"\boxed{1} and \boxeds{2}", "1"),
        ("", None),
        ("no box here", None),
        (r"<think>\boxed{3}</think> I give up", None),
        (r"\boxed{1} then the box is cut off \boxed{2", None),
        (r"\boxed", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@given(st.text())
def test_extract_answer_never_raises(text):
    result = extract_answer(text)
    assert result is None or result in text


@given(
    prefix=st.text(),
    content=st.text(alphabet=st.characters(blacklist_characters="{}\\<")),
    suffix=st.text(alphabet=st.characters(blacklist_characters="\\<")),
)
def test_the_final_box_is_found_after_anything(prefix, content, suffix):
    assert extract_answer(f"{prefix}\\boxed{{{content}}}{suffix}") == content


# --- equivalence --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "truth"),
    [
        ("42", "42"),
        (" 42 ", "42"),
        ("$42$", "42"),
        (r"\$42", "42"),
        ("42.", "42"),
        ("1,000", "1000"),
        ("1{,}000", "1000"),
        ("12,345.5", "12345.5"),
        ("x = 5", "5"),
        ("y_1=-3", "-3"),
        (r"\text{5}", "5"),
        (r"\textbf{\text{5}}", "5"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\tfrac{3}{4}", r"\frac{3}{4}"),
        (r"3\!\,\,000", "3000"),
        (r"90^\circ", "90"),
        (r"50\%", "50"),
        ("{7}", "7"),
    ],
)
def test_notational_variants_match(candidate, truth):
    assert answers_match(candidate, truth)


@pytest.mark.parametrize(
    ("candidate", "truth"),
    [
        ("0.5", r"\frac{1}{2}"),
        ("0.5", "1/2"),
        (r"\frac12", "0.5"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"\tfrac{3}{4}", "3/4"),
        ("2.50", "2.5"),
        (".25", "1/4"),
        ("0.1", r"\frac{1}{10}"),
    ],
)
def test_numbers_match_by_value(candidate, truth):
    assert answers_match(candidate, truth)
    assert answers_match(truth, candidate)


@pytest.mark.parametrize(
    ("candidate", "truth"),
    [
        (r"2\sqrt{2}", r"\sqrt{8}"),
        ("x^2+2x+1", "(x+1)^2"),
        (r"\frac{\pi}{2}", r"\pi/2"),
        (r"\sqrt{2}\cdot\sqrt{3}", r"\sqrt{6}"),
        (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}"),
        (r"\sqrt[3]{8}", "2"),
        (r"2^{10}", "1024"),
        (r"3 \times 4", "12"),
        (r"\sin(\pi/6)", "0.5"),
        (r"\frac{x}{2}", "0.5x"),
    ],
)
def test_symbolic_equivalences(candidate, truth):
    assert answers_match(candidate, truth)
    assert answers_match(truth, candidate)


@pytest.mark.parametrize(
    ("candidate", "truth"),
    [
        ("6", "5"),
        ("-5", "5"),
        ("0.333", "1/3"),
        ("1000", "1001"),
        ("1,00", "100"),  # not a thousands separator
        ("x+1", "x+2"),
        (r"\sqrt{2}", "1.414"),
        (r"2\sqrt{3}", r"\sqrt{8}"),
        ("1/0", "0"),
        (r"\frac{1}{0}", r"\frac{2}{0}"),
        ("", "0"),
        ("5", ""),
        (r"\int_0^1 x\,dx", "1/3"),
        ("2+", "2"),
    ],
)
def test_non_equivalences(candidate, truth):
    assert not answers_match(candidate, truth)


def test_overlong_answers_are_rejected_unread():
    long = "1" * (MAX_ANSWER_CHARS + 1)
    assert not answers_match(long, long)


def test_text_that_looks_like_python_is_never_run(tmp_path: Path):
    """Only math-verify's LaTeX parser reads answers; nothing reaches sympy's eval."""
    marker = tmp_path / "ran"
    for hostile in (
        f"__import__('os').system('touch {marker}')",
        f"open('{marker}', 'w')",
        "x.__class__",
        "lambda: 1",
    ):
        assert not answers_match(hostile, "0")
    assert not marker.exists()


def test_deep_nesting_is_refused_not_a_crash():
    deep = r"\sqrt{" * 300 + "4" + "}" * 300
    assert not answers_match(deep, "2")
    assert not answers_match("(" * 499 + "2" + ")" * 499, "2")


def test_a_pathological_check_times_out_and_the_worker_recovers():
    assert answers_match(r"2\sqrt{2}", r"\sqrt{8}")  # worker up before the clock starts
    start = time.monotonic()
    assert not answers_match(r"9^{9^{9}}", "1", timeout_s=0.5)
    assert time.monotonic() - start < 1.5
    assert answers_match(r"2\sqrt{2}", r"\sqrt{8}")
    assert not answers_match(r"2\sqrt{3}", r"\sqrt{8}")


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan"), float("inf")])
def test_bad_timeouts_are_rejected(timeout_s):
    with pytest.raises(ValueError, match="timeout_s"):
        answers_match("1", "1", timeout_s=timeout_s)


# --- verify_math --------------------------------------------------------------------------


def test_ground_truths_in_every_spelling():
    assert ground_truths({"ground_truth": "12"}) == ["12"]
    assert ground_truths({"ground_truth": 12}) == ["12"]
    assert ground_truths({"ground_truth": 0.5}) == ["0.5"]
    assert ground_truths({"ground_truth": r"\boxed{\frac{3}{4}}"}) == [r"\frac{3}{4}"]
    assert ground_truths({"ground_truth": ["3", r"\boxed{x=3}"]}) == ["3", "x=3"]


def test_any_ground_truth_of_a_list_matches():
    info = {"ground_truth": ["-3", r"\boxed{3}"]}
    assert verify_math(r"</think> \boxed{3}", info)
    assert verify_math(r"</think> \boxed{-3}", info)
    assert not verify_math(r"</think> \boxed{4}", info)


def test_verify_math_reads_the_final_answer_only():
    info = {"ground_truth": "85"}
    assert verify_math(r"<think>47+38... \boxed{84}?</think> So \boxed{85}.", info)
    assert not verify_math(r"<think>\boxed{85}</think> So \boxed{84}.", info)
    assert not verify_math("the answer is 85", info)
    assert verify_math(r"\boxed{85}", {"ground_truth": 85})


@pytest.mark.parametrize(
    "info",
    [
        {},
        {"ground_truth": None},
        {"ground_truth": ""},
        {"ground_truth": True},
        {"ground_truth": []},
        {"ground_truth": ["1", None]},
        {"ground_truth": float("nan")},
        ["85"],
        None,
    ],
)
def test_malformed_verification_info_is_an_error(info):
    with pytest.raises(ValueError, match="verification_info") as e:
        verify_math(r"\boxed{85}", info)
    assert "\n" not in str(e.value)


def test_the_sympy_worker_dies_with_its_parent(tmp_path):
    """A process killed mid-check must not leave its worker spinning, orphaned."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import os, sys, threading\n"
        "from swarmrl.tasks import math as m\n"
        "threading.Thread(target=m.answers_match, args=('9^{9^{9}}', '1', 60.0)).start()\n"
        "import time; time.sleep(2)\n"
        "print(m._WORKER.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # dead, waiting for init to reap it
            return
        time.sleep(0.05)
    os.kill(worker, signal.SIGKILL)
    raise AssertionError("the worker outlived its parent")


def test_the_checker_cpu_time_grows_with_checks_and_survives_a_new_worker():
    from swarmrl.tasks import math as m

    m.answers_match("1", "1")  # a worker is running
    before = m.checker_cpu_seconds()
    for i in range(300):
        m.answers_match(f"\\frac{{{i}}}{{7}}", f"{i}/7 + 0")
    grown = m.checker_cpu_seconds()
    assert grown > before
    m._WORKER._discard()  # as after an overrun: the next check starts a new worker
    assert m.checker_cpu_seconds() >= grown
    m.answers_match("2", "2")
    assert m.checker_cpu_seconds() >= grown


@pytest.mark.parametrize(
    ("candidate", "truth", "same"),
    [("12", "12", True), ("012", "12", True), ("+7", "7", True), ("-3", "3", False),
     ("12", "13", False), ("1000000000000000000001", "1000000000000000000001", True)],
)  # fmt: skip
def test_integers_are_compared_without_the_checker_process(candidate, truth, same):
    from swarmrl.tasks import math as m

    m._WORKER._discard()
    assert answers_match(candidate, truth) is same
    assert m._WORKER.pid is None  # sympy was never asked
    assert answers_match(candidate + ".0", truth) is same  # math-verify agrees
