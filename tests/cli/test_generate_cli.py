"""`selfspec generate` from the command line: SSR flags reach the policy and outputs stay exact."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from selfspec.cli.main import app
from selfspec.testing.tiny import save_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny-qwen3", "qwen3", seed=5)


def _reply(output: str) -> str:
    """The reply text: after the loading bars, before the timings line ("N tokens in ...")."""
    text = re.split(r"it/s\]", output)[-1]
    return re.split(r"\n\d+ tokens in ", text)[0]


@pytest.mark.parametrize(
    "extra",
    [["--ssr"], ["--ssr", "--speculate-thinking"], ["--ssr", "--speculate-thinking", "--thinking-speculator", "ngram"]],
    ids=["ssr", "ssr+think", "ssr+lookup"],
)
def test_generate_ssr_flags_give_the_plain_output(tiny_dir, extra):
    common = [
        "generate",
        "def add(a, b):",
        "--model",
        str(tiny_dir),
        "--max-tokens",
        "40",
        "--think",
        "--cot-cap",
        "20",
        "--answer-cap",
        "12",
        "--no-stream",
    ]
    plain = CliRunner().invoke(app, common)
    assert plain.exit_code == 0, plain.output
    fast = CliRunner().invoke(app, [*common, *extra, "--draft-budget", "5", "--max-draft", "20"])
    assert fast.exit_code == 0, fast.output
    assert _reply(fast.output) == _reply(plain.output)
    assert _reply(plain.output).strip(), plain.output
    assert "drafts=1" in fast.output, fast.output
    if "--speculate-thinking" in extra:
        steps = re.search(r"thinking_verify_steps=(\d+)", fast.output)
        assert steps and int(steps.group(1)) > 0, fast.output


def test_generate_takes_a_tokenizer_directory_and_names_a_wrong_one(tiny_dir, tmp_path):
    from selfspec.testing.tiny import tiny_tokenizer

    given = tmp_path / "tok"
    tiny_tokenizer().save_pretrained(given)
    common = ["generate", "def add(a, b):", "--model", str(tiny_dir), "--max-tokens", "12", "--no-stream"]
    own = CliRunner().invoke(app, common)
    other = CliRunner().invoke(app, [*common, "--tokenizer", str(given)])
    assert own.exit_code == 0 and other.exit_code == 0, own.output + other.output
    assert _reply(other.output) == _reply(own.output)  # the same tokenizer files: the same reply
    wrong = CliRunner().invoke(app, [*common, "--tokenizer", str(tmp_path / "nowhere")])
    assert wrong.exit_code == 2 and "not a tokenizer directory" in " ".join(wrong.output.split())


def test_generate_names_an_unknown_thinking_speculator(tiny_dir):
    args = ["generate", "hi", "--model", str(tiny_dir), "--ssr", "--speculate-thinking"]
    result = CliRunner().invoke(app, [*args, "--thinking-speculator", "bogus"])
    assert result.exit_code == 2, result.output
    assert "thinking_speculator" in result.output
