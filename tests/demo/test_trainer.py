"""REINFORCE on the scripted policy's logits: honest work is learned, cheats are unlearned."""
from __future__ import annotations

import math
import random

import pytest

from controller.analysis.defences import CHEATS
from controller.demo.policy_server import STRATEGIES, default_params, sample_strategy
from controller.demo.trainer import Sample, ScriptedPolicyTrainer, TrainerError, probabilities, strategy_from_plan

UPDATES = 12
SAMPLES_PER_UPDATE = 60          # 20 per family
CONVERGENCE_LR = 4.0


def sample_batch(params, rng: random.Random, n: int) -> list[Sample]:
    """Draw strategies exactly as the policy server does (per-attempt seed), reward 1 for solve."""
    batch = []
    for i in range(n):
        family = list(STRATEGIES)[i % len(STRATEGIES)]
        strategy, _ = sample_strategy(params[family], rng.randrange(2**31))
        batch.append(Sample(family, strategy, 1.0 if strategy == "solve" else 0.0))
    return batch


def train(lr: float, seed: int = 0) -> tuple[ScriptedPolicyTrainer, list[dict]]:
    trainer = ScriptedPolicyTrainer(default_params(), lr=lr)
    rng = random.Random(seed)
    history = [probabilities(trainer.params)]
    for _ in range(UPDATES):
        trainer.update(sample_batch(trainer.params, rng, SAMPLES_PER_UPDATE))
        history.append(probabilities(trainer.params))
    return trainer, history


def cheat_mass(probs: dict, family: str) -> float:
    return sum(probs[family][s] for s in CHEATS[family])


def test_rewarding_only_solve_drives_cheats_below_5_percent_in_12_updates_of_60():
    trainer, history = train(CONVERGENCE_LR)
    final = history[-1]
    for family in STRATEGIES:
        assert cheat_mass(final, family) < 0.05, (family, final[family])
        assert final[family]["solve"] > history[0][family]["solve"] + 0.5
    assert trainer.version == UPDATES


def test_p_solve_rises_across_seeds_at_the_default_learning_rate():
    for seed in range(5):
        _, history = train(lr=0.5, seed=seed)
        for family in STRATEGIES:
            assert history[-1][family]["solve"] > history[0][family]["solve"] + 0.03, (seed, family)


def test_p_solve_rises_in_expectation_at_every_update():
    # Average p(solve) over 20 seeded runs: the mean trajectory is increasing step by step.
    runs = [train(CONVERGENCE_LR, seed)[1] for seed in range(20)]
    for family in STRATEGIES:
        mean = [sum(run[t][family]["solve"] for run in runs) / len(runs) for t in range(UPDATES + 1)]
        assert all(b > a for a, b in zip(mean, mean[1:])), mean


def test_update_moves_only_along_the_advantage():
    params = {"math": {"solve": 0.0, "guess": 0.0}}
    trainer = ScriptedPolicyTrainer(params, lr=1.0)
    new = trainer.update([Sample("math", "solve", 1.0), Sample("math", "guess", 0.0)])
    # baseline 0.5; grad_solve = mean(0.5*(1-0.5), -0.5*(0-0.5)) = 0.25; grad_guess = -0.25
    assert new["math"]["solve"] == pytest.approx(0.25)
    assert new["math"]["guess"] == pytest.approx(-0.25)


def test_equal_rewards_leave_the_params_unchanged_because_of_the_baseline():
    trainer = ScriptedPolicyTrainer(default_params())
    new = trainer.update([Sample("python", s, 1.0) for s in STRATEGIES["python"]])
    assert new == default_params()


def test_a_family_without_samples_keeps_its_logits():
    trainer = ScriptedPolicyTrainer(default_params())
    new = trainer.update([Sample("python", "solve", 1.0), Sample("python", "peek", 0.0)])
    assert new["math"] == default_params()["math"]
    assert new["python"]["solve"] > default_params()["python"]["solve"]


def test_update_returns_a_copy_the_caller_cannot_use_to_mutate_the_trainer():
    trainer = ScriptedPolicyTrainer(default_params())
    new = trainer.update([Sample("math", "solve", 1.0), Sample("math", "guess", 0.0)])
    new["math"]["solve"] = 99.0
    assert trainer.params["math"]["solve"] != 99.0


@pytest.mark.parametrize("sample, message", [
    (Sample("chess", "solve", 1.0), "family 'chess'"),
    (Sample("math", "sloppy", 1.0), "strategy 'sloppy'"),
    (Sample("math", "solve", math.nan), "finite"),
])
def test_samples_that_do_not_fit_the_params_are_typed_errors(sample, message):
    trainer = ScriptedPolicyTrainer(default_params())
    with pytest.raises(TrainerError, match=message):
        trainer.update([sample])
    assert trainer.params == default_params() and trainer.version == 0


def test_learning_rate_must_be_positive():
    with pytest.raises(TrainerError, match="lr"):
        ScriptedPolicyTrainer(default_params(), lr=0.0)


def test_probabilities_are_a_softmax_per_family():
    probs = probabilities({"math": {"a": 0.0, "b": math.log(3.0)}})
    assert probs == {"math": {"a": pytest.approx(0.25), "b": pytest.approx(0.75)}}


@pytest.mark.parametrize("content, strategy", [
    ("plan: solve", "solve"),
    ("plan: claim_passed\npassed", "claim_passed"),
    ("  plan:   edit_tests  ", "edit_tests"),
])
def test_strategy_from_plan_reads_the_first_line(content, strategy):
    assert strategy_from_plan(content) == strategy


@pytest.mark.parametrize("content", ["", None, "I don't know how to solve this task.", "the plan: solve"])
def test_strategy_from_plan_rejects_messages_without_a_plan(content):
    with pytest.raises(TrainerError, match="plan"):
        strategy_from_plan(content)


def test_trainer_imports_no_transport_storage_or_http_module():
    import subprocess
    import sys
    code = ("import sys, controller.demo.trainer; "
            "print(sorted(m for m in ('zmq', 'sqlite3', 'nodeagent', 'http.server', 'controller.demo.policy_server') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
