"""The arbitrator training run (`cospec.train_arbitrator` and its phases) at toy scale on a tiny random model."""

from __future__ import annotations

import json
import math

import pytest
import torch
import typer
from typer.testing import CliRunner

from selfspec import LLM, CoSpecConfig, EngineConfig, SamplingParams
from selfspec.spec.cospec import Arbitrator
from selfspec.spec.cospec.arbitrator import ArbitrationState
from selfspec.spec.cospec.checkpoint import load_arbitrator, read_checkpoint_config
from selfspec.spec.cospec.policy import Decision
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec_bench.datasets.gsm8k import load_gsm8k
from selfspec_research.cospec.arbitrator_config import TrainConfig
from selfspec_research.cospec.arbitrator_data import gsm8k_training_ids, training_tasks
from selfspec_research.cospec.arbitrator_rl import RewardSettings, rl_iteration, rl_prompts_for, rollout_reward
from selfspec_research.cospec.arbitrator_sft import mean_bce, run_sft
from selfspec_research.cospec.arbitrator_states import branch_logprob_sums, collect_states, label_states
from selfspec_research.cospec.eval_config import CoSpecEvalConfig
from selfspec_research.cospec.eval_tasks import EvalTask, build_task
from selfspec_research.cospec.evaluate import run_cospec_eval
from selfspec_research.cospec.train_arbitrator import train_arbitrator
from selfspec_research.cospec.train_cli import register
from selfspec_research.cospec.training import frozen_copy
from selfspec_research.thinker.tasks import stable_rng

TASKS = "arithmetic_search,gsm8k"


def _config(tmp_path=None, **overrides) -> TrainConfig:
    values = dict(
        target="tiny",
        draft="layers:1",
        tasks=TASKS,
        n=2,
        k=4,
        max_tokens=24,
        cf_max_new_tokens=24,
        states_per_item=4,
        sft_epochs=3,
        sft_batch_size=4,
        sft_lr=3e-3,
        rl_iterations=1,
        rl_prompts=1,
        group_size=4,
        rl_lr=3e-3,
        ppo_minibatch=16,
        device="cpu",
        progress=False,
        out=str(tmp_path or "unused"),
        command="pytest",
    )
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def llm():
    tok = tiny_tokenizer()
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    return LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=16, max_len=1024), draft="layers:1")


@pytest.fixture(scope="module")
def tasks():
    return training_tasks(_config())


def _decisive_scorer(task: EvalTask) -> EvalTask:
    """The task without thinking (a random tiny model never closes its thinking, so its answer
    part would be empty) and a stand-in checker whose verdict depends on the answer text, so
    the two branches of a state can score differently."""

    def score(references, answers):
        out = []
        for answer in answers:
            value = (len(answer) % 3) / 2.0
            out.append((value == 1.0, value))
        return out

    return EvalTask(task.name, task.items, False, score)


@pytest.fixture(scope="module")
def stub_tasks(tasks):
    return [_decisive_scorer(t) for t in tasks]


@pytest.fixture(scope="module")
def collected(llm, stub_tasks):
    states, stats = collect_states(llm, stub_tasks, _config())
    return states, stats


@pytest.fixture(scope="module")
def labelled(llm, stub_tasks, collected):
    states, _ = collected
    examples, stats = label_states(llm, states, stub_tasks, _config())
    return examples, stats


# ------------------------------------------------------------------ data


def test_training_items_come_from_the_training_streams_only(tasks):
    config = _config()
    thinker = [t for t in tasks if t.name != "gsm8k"]
    gsm8k = [t for t in tasks if t.name == "gsm8k"]
    assert [t.name for t in tasks] == ["arithmetic_search", "gsm8k"]
    for item in thinker[0].items:
        assert item.reference.seed == 0 and item.reference.index >= 2000, item.uid
    assert [item.uid for item in gsm8k[0].items] == gsm8k_training_ids(2)
    assert gsm8k_training_ids(5)[:2] == gsm8k_training_ids(2), "larger n extends the same reserved order"
    assert config.data_seed == 0
    with pytest.raises(ValueError, match="held-out"):
        _config(data_seed=1000)
    with pytest.raises(ValueError, match="unknown tasks"):
        _config(tasks="gsm8k,nope")


def test_eval_excludes_the_reserved_gsm8k_ids(llm):
    # Without exclusions the eval's pick is unchanged (a list pool samples like range()).
    plain = build_task("gsm8k", 3, 1000)
    samples = load_gsm8k()
    expected = sorted(stable_rng("cospec-eval", "gsm8k", 1000).sample(range(len(samples)), 3))
    assert [item.uid for item in plain.items] == [samples[i].id for i in expected]
    excluded = [item.uid for item in plain.items]
    other = build_task("gsm8k", 3, 1000, exclude_gsm8k_ids=excluded)
    assert not set(excluded) & {item.uid for item in other.items}
    # run_cospec_eval reads the ids from the arbitrator's checkpoint identity.
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=0)
    first = build_task("gsm8k", 1, 1000).items[0].uid
    arbitrator.identity = {"training": {"data_seeds": [0], "gsm8k_ids": [first]}}
    config = CoSpecEvalConfig(
        tasks=("gsm8k",), n=1, thresholds=(1.0,), k=4, max_tokens=2, counterfactual_states=0, warmup=False
    )
    results = run_cospec_eval(llm, config, arbitrator, progress=False)
    uids = {r["uid"] for r in results.items}
    assert uids and first not in uids


def test_state_collection_yields_states_on_training_items_only(llm, tasks, collected):
    states, stats = collected
    assert states and stats["states"] == len(states) and stats["cancelled_rollouts"] == 0
    training_uids = {item.uid for t in tasks for item in t.items}
    assert {s.uid for s in states} <= training_uids
    per_item = {}
    for s in states:
        per_item[s.uid] = per_item.get(s.uid, 0) + 1
        d = s.decision
        assert d.state.draft_block[0] != d.state.target_block[0]
        assert d.prompt_len > 0 and len(d.context) > d.prompt_len
        assert tuple(d.context[-len(d.state.prefix) :]) == d.state.prefix
    assert max(per_item.values()) <= 4


# ------------------------------------------------------------------ labels


def test_checker_labels_continue_both_branches_to_the_end(llm, collected, labelled):
    states, _ = collected
    examples, stats = labelled
    assert len(examples) == len(states) == stats["labelled"] and stats["dropped_by_deadline"] == 0
    assert {x.label for x in examples} <= {0.0, 1.0}
    sources = {x.source for x in examples}
    assert "checker" in sources, "the stand-in checker should decide some states"
    for x in examples:
        assert x.finish[0] in ("stop", "length") and x.finish[1] in ("stop", "length")
        assert x.branch_tokens == (x.state.draft_block[0], x.state.target_block[0])
        if x.source == "checker":
            assert x.label == float(x.draft_score > x.target_score) and x.draft_score != x.target_score
        else:
            assert x.source == "likelihood" and x.draft_score == x.target_score and math.isfinite(x.gain)
            assert x.label == float(x.gain >= -3.0)
    assert stats["branch_tokens"] > 0


def test_batched_branch_logprobs_match_a_plain_forward(llm):
    rows = [([5, 6, 7, 8, 9, 10], 3), ([11, 12, 13], 2), ([20, 21, 22, 23], 1)]
    batched = branch_logprob_sums(llm.model, rows, tokens_per_batch=12)
    for (ids, n), value in zip(rows, batched):
        with torch.no_grad():
            logits = llm.model(input_ids=torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        expected = sum(float(logprobs[p - 1, ids[p]]) for p in range(len(ids) - n, len(ids)))
        assert value == pytest.approx(expected, abs=1e-4)


# ------------------------------------------------------------------ SFT and RL


def test_sft_lowers_bce(llm, labelled):
    examples, _ = labelled
    torch.manual_seed(0)
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=0)
    stats = run_sft(arbitrator, examples, _config(sft_epochs=4))
    assert stats["steps"] == 4 * math.ceil(len(examples) / 4)
    assert stats["bce_after"] < stats["bce_before"] - 0.05
    assert mean_bce(arbitrator, examples) == pytest.approx(stats["bce_after"])


def test_sampled_decisions_record_logits_and_target_logprobs(llm):
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=0)
    with torch.no_grad():
        arbitrator.head.bias.fill_(0.0)
    runs = []
    for _ in range(2):
        decisions = []
        spec = CoSpecConfig(num_speculative_tokens=4, arbitrator=arbitrator, recorder=decisions.append, sample_seed=7)
        out = llm.generate(["What is 12 + 30?"], SamplingParams(max_tokens=24), spec=spec)[0]
        runs.append((out.token_ids, decisions))
    (first, decisions), (second, again) = runs
    assert first == second and [d.kept for d in decisions] == [d.kept for d in again], "a seed fixes the samples"
    assert decisions and all(d.sampled and d.keep_logit is not None for d in decisions)
    assert all(d.target_logprob is not None and d.target_logprob <= 0.0 for d in decisions)
    for d in decisions:
        assert d.keep_probability == pytest.approx(1 / (1 + math.exp(-d.keep_logit)), rel=1e-6)
    with pytest.raises(ValueError, match="sample_seed"):
        llm.submit("hi", SamplingParams(max_tokens=2), spec=CoSpecConfig(sample_seed=1, threshold=2.0))


def test_rollout_reward_parts():
    state = ArbitrationState((1,), (2,), (3,))
    decisions = [
        Decision(state, 0.9, True, target_logprob=-8.0),
        Decision(state, 0.9, True, target_logprob=-1.0),
        Decision(state, 0.1, False, target_logprob=-0.5),
        Decision(state, 0.1, False, target_logprob=-0.5),
    ]
    settings = RewardSettings(
        speed_coef=0.1, low_logprob_floor=-5.0, low_logprob_penalty=0.4, failed_rejection_penalty=0.2
    )
    failed = rollout_reward(0.25, False, 30, 10, decisions, settings)
    assert failed["accepted_per_call"] == 3.0 and failed["low_logprob_kept"] == 1.0
    assert failed["reward"] == pytest.approx(0.25 + 0.3 - 0.4 * 1 / 4 - 0.2 * 2 / 4)
    passed = rollout_reward(1.0, True, 30, 10, decisions, settings)
    assert passed["rejection_penalty"] == 0.0 and passed["reward"] == pytest.approx(1.0 + 0.3 - 0.1)


def test_one_ppo_iteration_with_four_rollouts_changes_the_policy(llm, tasks, labelled):
    examples, _ = labelled
    torch.manual_seed(0)
    config = _config(group_size=4, rl_prompts=1, ppo_epochs=2, ppo_minibatch=16)
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=0)
    run_sft(arbitrator, examples, config)
    reference = frozen_copy(arbitrator)
    probe = [x.state for x in examples[:8]]
    before = arbitrator.keep_probability(probe)
    optimizer = torch.optim.AdamW(arbitrator.trainable_parameters(), lr=config.rl_lr)
    prompts = rl_prompts_for(tasks, config, 0, lambda t, item: True)
    records = []
    summary = rl_iteration(llm, arbitrator, reference, optimizer, prompts, config, 0, log=records.append)
    assert summary is not None and summary["rollouts"] == 4 and summary["decisions_used"] > 0
    assert summary["updates"] == len(records) > 0
    after = arbitrator.keep_probability(probe)
    assert (after - before).abs().max() > 1e-4, "PPO did not change the policy"
    assert math.isfinite(summary["kl"]) and summary["kl"] >= 0.0 and math.isfinite(summary["mean_reward"])
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) for r in records)
    assert torch.equal(reference.keep_probability(probe), before), "the SFT reference must stay frozen"


# ------------------------------------------------------------------ the whole run


def test_pipeline_writes_a_loadable_checkpoint_with_its_training_ids_and_resumes(llm, tmp_path):
    config = _config(tmp_path / "run", rl_iterations=1)
    result = train_arbitrator(config, llm, echo=lambda message: None)
    checkpoint = read_checkpoint_config(result.checkpoint)
    training = checkpoint.training
    assert training["data_seeds"] == [0]
    assert training["gsm8k_ids"] == gsm8k_training_ids(2)
    assert training["thinker_items"]["uids"] == ["arithmetic_search-v1-s0-i2000", "arithmetic_search-v1-s0-i2001"]
    assert (
        training["command"] == "pytest"
        and training["rl_iterations"] == 1
        and training["stopped_by_time_budget"] is False
    )
    assert checkpoint.draft == "layers:1"
    restored = load_arbitrator(result.checkpoint, llm.draft_runner.model)
    assert restored.identity["training"]["gsm8k_ids"] == gsm8k_training_ids(2)
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    phases = [line["phase"] for line in lines]
    assert phases[:2] == ["collect", "label"] and "sft" in phases and "rl" in phases and phases[-1] == "done"
    assert all(math.isfinite(line["loss"]) for line in lines if line["phase"] in ("sft", "rl"))
    # A used directory is refused without resume; resume runs only the missing RL iteration.
    with pytest.raises(ValueError, match="resume"):
        train_arbitrator(config, llm, echo=lambda message: None)
    again = train_arbitrator(_config(tmp_path / "run", rl_iterations=2, resume=True), llm, echo=lambda message: None)
    assert [row["iteration"] for row in again.stats["rl"]] == [0, 1]
    assert read_checkpoint_config(again.checkpoint).training["rl_iterations"] == 2
    with pytest.raises(ValueError, match="other data options"):
        train_arbitrator(_config(tmp_path / "run", n=3, resume=True), llm, echo=lambda message: None)


def test_time_budget_stops_the_run_and_still_saves(llm, tmp_path):
    import time

    config = _config(tmp_path / "budget", rl_iterations=1000, time_budget_s=1.0)
    started = time.monotonic()
    result = train_arbitrator(config, llm, echo=lambda message: None)
    assert time.monotonic() - started < 20.0  # the stop itself is asserted below; room for a busy CPU
    assert result.stats["stopped_by_time_budget"] is True
    assert len(result.stats.get("rl", [])) < 1000
    training = read_checkpoint_config(result.checkpoint).training
    assert training["stopped_by_time_budget"] is True and training["gsm8k_ids"] == gsm8k_training_ids(2)
    load_arbitrator(result.checkpoint, llm.draft_runner.model)


def test_cli_command_registers_and_trains(tmp_path):
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """test app"""

    register(app)
    out = tmp_path / "cli"
    args = [
        "train-arbitrator",
        "--target",
        "tiny",
        "--draft",
        "layers:1",
        "--tasks",
        "gsm8k",
        "--n",
        "1",
        "--k",
        "4",
        "--max-tokens",
        "12",
        "--cf-max-new-tokens",
        "8",
        "--sft-epochs",
        "1",
        "--rl-iterations",
        "1",
        "-M",
        "2",
        "--device",
        "cpu",
        "--max-len",
        "1024",
        "--num-slots",
        "4",
        "--no-progress",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    training = read_checkpoint_config(out / "checkpoint").training
    assert training["command"].startswith("selfspec cospec train-arbitrator --target tiny")
    assert training["gsm8k_ids"] == gsm8k_training_ids(1) and training["data_seeds"] == []
    bad = CliRunner().invoke(app, ["train-arbitrator", "--data-seed", "1000", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "held-out" in bad.output
