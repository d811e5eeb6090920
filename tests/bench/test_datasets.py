"""Loaders of selfspec_bench.datasets: counts on the real files, prompt contents,
path/data_dir overrides with small files of the same format, and missing-file errors."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from selfspec_bench import available_benchmarks, load_benchmark
from selfspec_bench.datasets import LONGPROC_TASKS
from selfspec_bench.datasets.countdown_search import solve_with_trace
from selfspec_bench.datasets.longproc import default_data_dir
from selfspec_bench.datasets.paths import shared_datasets_dir

LONGPROC_DIR = default_data_dir()
CLASSEVAL_FILE = shared_datasets_dir() / "classeval" / "ClassEval_data.json"

needs_shared = pytest.mark.skipif(
    not LONGPROC_DIR.is_dir() or not CLASSEVAL_FILE.is_file(), reason="shared datasets directory not present"
)


def _user_text(sample) -> str:
    assert [m["role"] for m in sample.messages] == ["user"]
    return sample.messages[0]["content"]


def test_registry_lists_every_benchmark():
    names = available_benchmarks()
    for name in ["humaneval", "classeval", "gsm8k", "mbpp", "math500", "longproc"]:
        assert name in names
    for task in LONGPROC_TASKS:
        assert f"longproc/{task}" in names
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("no-such-bench")


# ---- counts on the real files -------------------------------------------------------


@pytest.mark.parametrize("name, expected", [("humaneval", 164), ("gsm8k", 1319), ("mbpp", 500), ("math500", 500)])
def test_wheel_benchmarks_counts_and_unique_ids(name, expected):
    samples = load_benchmark(name)
    assert len(samples) == expected
    assert len({s.id for s in samples}) == expected
    assert all(s.benchmark == name for s in samples)


@needs_shared
def test_classeval_count():
    samples = load_benchmark("classeval")
    assert len(samples) == 100
    assert len({s.id for s in samples}) == 100


@needs_shared
@pytest.mark.parametrize("task", LONGPROC_TASKS)
def test_longproc_task_counts_match_files(task):
    raw = json.loads((LONGPROC_DIR / task / f"{task}_0.5k.json").read_text(encoding="utf-8"))
    samples = load_benchmark(f"longproc/{task}")
    assert len(samples) == len(raw) >= 40
    assert len({s.id for s in samples}) == len(samples)
    assert all(s.benchmark == f"longproc/{task}" for s in samples)


@needs_shared
def test_longproc_all_applies_limit_per_task():
    samples = load_benchmark("longproc", limit=2, offset=1)
    assert [s.benchmark for s in samples] == [f"longproc/{t}" for t in LONGPROC_TASKS for _ in range(2)]
    assert samples[0].id.endswith("/1")


def test_limit_and_offset_window():
    everything = load_benchmark("humaneval")
    window = load_benchmark("humaneval", limit=3, offset=10)
    assert [s.id for s in window] == [s.id for s in everything[10:13]]
    assert load_benchmark("humaneval", limit=0) == []
    with pytest.raises(ValueError):
        load_benchmark("humaneval", offset=-1)


# ---- prompt contents ----------------------------------------------------------------


def test_humaneval_prompt_contains_function_and_instruction():
    sample = load_benchmark("humaneval", limit=1)[0]
    text = _user_text(sample)
    assert sample.id == "HumanEval/0"
    assert "Complete the following Python function" in text and "```python" in text
    assert sample.reference["prompt"].strip() in text
    assert sample.reference["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in sample.reference["test"]


@needs_shared
def test_classeval_prompt_uses_classeval_instruction_and_skeleton():
    raw = json.loads(CLASSEVAL_FILE.read_text(encoding="utf-8"))[0]
    sample = load_benchmark("classeval", limit=1)[0]
    text = _user_text(sample)
    assert text.startswith(f"Please complete the class {raw['class_name']} in the following code.\n")
    assert raw["skeleton"].strip() in text
    assert "```python```" in text
    assert sample.reference["class_name"] == raw["class_name"]
    assert sample.reference["import_statement"] == raw["import_statement"]
    assert sample.reference["test_classes"] == raw["test_classes"]


@needs_shared
def test_classeval_test_class_names_are_stripped():
    sample = load_benchmark("classeval", offset=97, limit=1)[0]
    assert "Words2NumbersTestMain" in sample.reference["test_classes"]


def test_math_and_mbpp_prompts():
    gsm = load_benchmark("gsm8k", limit=1)[0]
    assert "Janet" in _user_text(gsm) and "####" in _user_text(gsm)
    assert gsm.reference["answer"] == "18"
    math = load_benchmark("math500", limit=1)[0]
    assert "\\boxed{}" in _user_text(math) and "polar coordinates" in _user_text(math)
    # Gold is the solution's last box, not the wheel's lossy normalized copy.
    assert math.reference["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    mbpp = load_benchmark("mbpp", limit=1)[0]
    text = _user_text(mbpp)
    assert "remove first and last occurrence" in text
    assert all(test in text for test in mbpp.reference["tests"])
    assert mbpp.reference["entry_point"] == "remove_Occ"


@needs_shared
def test_countdown_prompt_has_examples_and_problem_but_not_its_answer():
    raw = json.loads((LONGPROC_DIR / "countdown" / "countdown_0.5k.json").read_text(encoding="utf-8"))[0]
    sample = load_benchmark("longproc/countdown", limit=1)[0]
    text = _user_text(sample)
    assert text.rstrip().endswith(f"Numbers: {raw['nums']}\nTarget: {raw['target']}")
    assert "# Example\nNumbers: [40, 19, 23, 7]\nTarget: 29" in text
    assert "# Example\nNumbers: [9, 16, 6, 18]\nTarget: 12" in text
    assert f"Initial number set: {raw['nums']}" not in text  # the item's own trace must not leak
    assert "{demonstration}" not in text and "{nums}" not in text


@needs_shared
def test_countdown_search_reproduces_the_datasets_traces():
    """Our regenerated trace equals each item's stored trace (older tag format) for every item."""
    items = json.loads((LONGPROC_DIR / "countdown" / "countdown_0.5k.json").read_text(encoding="utf-8"))
    for item in items:
        solution, trace = solve_with_trace(item["nums"], item["target"])
        legacy = trace.replace("# Search Procedure\n", "<Search Procedure>\n", 1).replace(
            "\n\nNow we have found", "\n</Search Procedure>\n\nNow we have found", 1
        )
        assert legacy == item["demonstration"]
        assert "\n".join(solution) == item["solution_text"]


@needs_shared
def test_longproc_prompts_are_filled_templates():
    html = load_benchmark("longproc/html_to_tsv", limit=1)[0]
    raw_html = json.loads((LONGPROC_DIR / "html_to_tsv" / "html_to_tsv_0.5k.json").read_text(encoding="utf-8"))[0]
    page = (LONGPROC_DIR / "html_to_tsv" / raw_html["html_path"]).read_text(encoding="utf-8")
    text = _user_text(html)
    assert f"```html\n{page}\n```" in text
    assert f"```tsv\n{raw_html['tsv_header']}\n{{Your TSV output}}\n```" in text
    assert raw_html["task_topic"] in text

    route = load_benchmark("longproc/path_traversal", limit=1)[0]
    text = _user_text(route)
    assert "Now find the route from Lille to Bromsgrove based on the information above." in text
    assert "You can travel from Vladivostok to Guildford by ferry." in text

    code = load_benchmark("longproc/pseudo_to_code", limit=1)[0]
    text = _user_text(code)
    assert "[PSEUDOCODE]:\ndefine the main function\n    create integer k" in text
    assert code.reference["testcases"][0] == [["7 1 4"], ["6"]]

    tom = load_benchmark("longproc/tom_tracking", limit=1)[0]
    text = _user_text(tom)
    assert "[QUESTION]\nWhere does Leon believe the band-aid is?" in text
    assert "Step 10: Carol moves the tweezers to the pantry's pedestal." in text
    assert "{Catherine location: patio;" in text and "{{" not in text  # escaped braces were formatted


# ---- path / data_dir overrides with small files -------------------------------------


def test_humaneval_path_option(tmp_path):
    rows = [
        {
            "task_id": "Mini/0",
            "prompt": 'def f(x):\n    """Double."""\n',
            "entry_point": "f",
            "canonical_solution": "    return 2 * x\n",
            "test": "def check(c):\n    assert c(2) == 4\n",
        }
    ]
    target = tmp_path / "mini.jsonl.gz"
    with gzip.open(target, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(json.dumps(r) for r in rows) + "\n")
    samples = load_benchmark("humaneval", path=target)
    assert [s.id for s in samples] == ["Mini/0"]
    assert "def f(x):" in _user_text(samples[0])


@needs_shared
def test_classeval_path_option(tmp_path):
    rows = json.loads(CLASSEVAL_FILE.read_text(encoding="utf-8"))[:2]
    target = tmp_path / "ce.json"
    target.write_text(json.dumps(rows), encoding="utf-8")
    assert [s.id for s in load_benchmark("classeval", path=target)] == [r["task_id"] for r in rows]


def test_olmo_style_path_options(tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(json.dumps({"doc": {"id": 7, "question": "What is 2+2?", "answer": "2+2=4\n#### 4"}}) + "\n")
    sample = load_benchmark("gsm8k", path=gsm)[0]
    assert sample.id == "gsm8k/7" and sample.reference["answer"] == "4"

    math = tmp_path / "math.jsonl.gz"
    with gzip.open(math, "wt", encoding="utf-8") as handle:
        handle.write(
            json.dumps(
                {
                    "index": 3,
                    "problem": "Compute 1/2.",
                    "solution": "It is $\\boxed{\\frac12}$.",
                    "answer": "\\frac{1}{2}",
                }
            )
            + "\n"
        )
    sample = load_benchmark("math500", path=math)[0]
    assert sample.id == "math500/3" and sample.reference["answer"] == "\\frac12"

    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(
        json.dumps(
            {
                "task_id": 1,
                "text": "Add.",
                "code": "def add(a, b):\n    return a + b",
                "test_list": ["assert add(1, 2) == 3"],
                "test_setup_code": "",
            }
        )
        + "\n"
    )
    sample = load_benchmark("mbpp", path=mbpp)[0]
    assert sample.id == "mbpp/1" and sample.reference["entry_point"] == "add"


@needs_shared
@pytest.mark.parametrize("task", LONGPROC_TASKS)
def test_longproc_path_and_data_dir_options(tmp_path, task):
    """A two-item file of the same layout loads through both path= and data_dir=/length=."""
    source = LONGPROC_DIR / task
    task_dir = tmp_path / "lp" / task
    task_dir.mkdir(parents=True)
    items = json.loads((source / f"{task}_0.5k.json").read_text(encoding="utf-8"))[:2]
    (task_dir / f"{task}_2k.json").write_text(json.dumps(items), encoding="utf-8")
    shutil.copy(source / "prompts.yaml", task_dir / "prompts.yaml")
    if task == "html_to_tsv":
        (task_dir / "webpage").mkdir()
        for item in items:
            shutil.copy(source / item["html_path"], task_dir / item["html_path"])
    by_path = load_benchmark(f"longproc/{task}", path=task_dir / f"{task}_2k.json", length="2k")
    by_dir = load_benchmark(f"longproc/{task}", data_dir=tmp_path / "lp", length="2k")
    reference = load_benchmark(f"longproc/{task}", limit=2)
    assert len(by_path) == len(by_dir) == 2
    assert [s.messages for s in by_path] == [s.messages for s in by_dir] == [s.messages for s in reference]


# ---- missing files --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["humaneval", "classeval", "gsm8k", "mbpp", "math500", "longproc/countdown"])
def test_missing_path_names_path_and_option(tmp_path, name):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError) as info:
        load_benchmark(name, path=missing)
    assert str(missing) in str(info.value) and "path=" in str(info.value)


def test_missing_longproc_data_dir_names_option(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir="):
        load_benchmark("longproc/tom_tracking", data_dir=tmp_path / "absent")
    (tmp_path / "tom_tracking").mkdir()
    with pytest.raises(FileNotFoundError, match="tom_tracking_9k.json"):
        load_benchmark("longproc/tom_tracking", data_dir=tmp_path, length="9k")


def test_shared_dir_env_var_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("SELFSPEC_SHARED_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        load_benchmark("classeval")
    assert str(tmp_path / "datasets" / "classeval" / "ClassEval_data.json") in str(info.value)


def test_benchsample_prompt_property():
    sample = load_benchmark("gsm8k", limit=1)[0]
    assert sample.prompt == sample.messages[0]["content"]
    json.dumps(sample.reference)  # references are plain data, so runs can record them as JSONL
