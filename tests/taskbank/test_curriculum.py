"""Curriculum: decayed Beta estimates, the band sampler, drift, quarantine, persistence."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from controller.taskbank.curriculum import Curriculum, CurriculumConfig, CurriculumError

TASKS = [f"sha256:{i:064x}" for i in range(10)]


@pytest.fixture
def cur(tmp_path):
    with Curriculum(tmp_path / "bank" / "curriculum.sqlite", TASKS) as c:
        yield c


def _feed(c: Curriculum, task: str, version: int, passes: int, fails: int) -> None:
    for i in range(passes):
        c.record(task, version, "pass", rollout_id=f"{task}-{version}-p{i}")
    for i in range(fails):
        c.record(task, version, "fail", rollout_id=f"{task}-{version}-f{i}")


def test_unseen_tasks_are_explored_and_the_estimate_is_the_prior_mean(cur):
    assert set(cur.classify(0).values()) == {"explore"}
    assert cur.estimates(0)[TASKS[0]].mean == 0.5
    assert Counter(cur.sample(20, random.Random(1), 0)) == Counter({t: 2 for t in TASKS})


def test_band_classes_follow_the_estimate(cur):
    _feed(cur, TASKS[0], 0, 5, 5)      # 0.5 -> band
    _feed(cur, TASKS[1], 0, 10, 0)     # always solved
    _feed(cur, TASKS[2], 0, 0, 10)     # never solved
    classes = cur.classify(0)
    assert (classes[TASKS[0]], classes[TASKS[1]], classes[TASKS[2]]) == ("band", "too_easy", "too_hard")


def test_recent_versions_outweigh_old_ones_so_a_learned_task_drifts_out(cur):
    _feed(cur, TASKS[0], 0, 2, 8)
    _feed(cur, TASKS[0], 1, 5, 5)
    assert cur.classify(1)[TASKS[0]] == "band"
    _feed(cur, TASKS[0], 2, 10, 0)
    _feed(cur, TASKS[0], 3, 10, 0)
    e = cur.estimates(3)[TASKS[0]]
    assert e.mean > 0.8 and cur.classify(3)[TASKS[0]] == "too_easy"
    # Without decay the old failures would keep it inside the band.
    flat = Curriculum(cur.path, TASKS, CurriculumConfig(decay=1.0))
    assert flat.estimates(3)[TASKS[0]].mean < e.mean


def test_sample_serves_the_band_plus_the_exploration_share(cur):
    for t in TASKS[:4]:
        _feed(cur, t, 0, 5, 5)
    for t in TASKS[4:8]:
        _feed(cur, t, 0, 10, 0)
    picks = cur.sample(100, random.Random(7), 0)
    counts = Counter(cur.classify(0)[t] for t in picks)
    assert counts == {"band": 80, "explore": 20}
    assert set(picks) <= set(TASKS[:4]) | set(TASKS[8:])


def test_sample_is_deterministic_under_a_seed(cur):
    _feed(cur, TASKS[0], 0, 5, 5)
    a = cur.sample(30, random.Random(42), 0)
    assert a == cur.sample(30, random.Random(42), 0)
    assert a != cur.sample(30, random.Random(43), 0)


def test_band_bounds_are_configurable(tmp_path):
    c = Curriculum(tmp_path / "c.sqlite", TASKS, CurriculumConfig(band_low=0.6, band_high=0.95))
    _feed(c, TASKS[0], 0, 5, 5)
    _feed(c, TASKS[1], 0, 8, 2)
    assert c.classify(0)[TASKS[0]] == "too_hard" and c.classify(0)[TASKS[1]] == "band"
    with pytest.raises(ValueError, match="band_low"):
        CurriculumConfig(band_low=0.9, band_high=0.1)


def test_with_nothing_in_band_or_unexplored_the_nearest_tasks_are_served(cur):
    for t in TASKS:
        _feed(cur, t, 0, 10, 0)
    _feed(cur, TASKS[3], 0, 0, 1)      # 11/13: nearest to the band
    picks = cur.sample(5, random.Random(0), 0)
    assert len(picks) == 5 and set(picks) == {TASKS[3]}


def test_same_solution_with_different_verdicts_quarantines_the_task_as_flaky(cur):
    cur.record(TASKS[0], 0, "pass", solution_hash="abc123", rollout_id="r1")
    cur.record(TASKS[0], 0, "fail", solution_hash="other", rollout_id="r2")
    assert cur.quarantined() == {}
    cur.record(TASKS[0], 1, "fail", solution_hash="abc123", rollout_id="r3")
    assert cur.quarantined()[TASKS[0]].startswith("flaky: solution abc123")
    assert TASKS[0] not in cur.sample(50, random.Random(0), 1)


def test_broken_reference_and_repeated_dead_letters_quarantine_with_the_reason(cur):
    cur.record_reference(TASKS[1], False, "test_hidden.py::test_x failed")
    for _ in range(3):
        cur.record_infra_failure(TASKS[2], "sandbox_start: image missing")
    q = cur.quarantined()
    assert q[TASKS[1]] == "broken: reference solution fails: test_hidden.py::test_x failed"
    assert q[TASKS[2]].startswith("broken: 3 rollouts dead-lettered")
    cur.release(TASKS[1])
    assert TASKS[1] not in cur.quarantined()


def test_all_quarantined_is_a_clear_error(tmp_path):
    c = Curriculum(tmp_path / "c.sqlite", TASKS[:1])
    c.quarantine(TASKS[0], "broken: manual")
    with pytest.raises(CurriculumError, match="all 1 tasks are quarantined"):
        c.sample(3, random.Random(0), 0)


def test_infra_errors_never_count_and_recording_is_idempotent_per_rollout(cur):
    assert cur.record(TASKS[0], 0, "infra_error", rollout_id="x") is False
    assert cur.record(TASKS[0], 0, "pass", rollout_id="r") is True
    assert cur.record(TASKS[0], 0, "pass", rollout_id="r") is False
    assert cur.estimates(0)[TASKS[0]].evidence == 1.0


def test_estimates_persist_across_reopen(tmp_path):
    path = tmp_path / "c.sqlite"
    with Curriculum(path, TASKS) as c:
        _feed(c, TASKS[0], 0, 6, 2)
        c.quarantine(TASKS[5], "broken: manual")
    with Curriculum(path, TASKS) as again:
        assert again.estimates(0)[TASKS[0]].evidence == 8.0
        assert again.classify(0)[TASKS[5]] == "quarantined"


def test_the_local_run_feeds_committed_outcomes_with_a_solution_hash(tmp_path):
    """controller.demo.localrun reads a batch back from the store; same actions = same solution."""
    from controller.analysis.query import connect
    from controller.demo.localrun import _record_outcomes
    from controller.store.catalog import Catalog
    from nodeagent.store.writer import write_attempt
    from tests.store.test_store import T0, rollout_row, step_row
    run = tmp_path / "run"
    cat = Catalog(run)
    for rid, outcome in (("r1", "pass"), ("r2", "fail"), ("r3", "infra_error")):
        row = rollout_row(rid, outcome=outcome, task_id=TASKS[0])
        shards = write_attempt(run, "n1", row, [step_row(0)], [])
        cat.commit(rid, 1, 1, shards, committed_at=T0)
    cat.flush()
    with Curriculum(tmp_path / "c.sqlite", TASKS) as c:
        con = connect(run)
        _record_outcomes(c, con, "b0")
        _record_outcomes(c, con, "b0")           # idempotent per rollout
        assert c.estimates(0)[TASKS[0]].evidence == 2.0
        assert c.quarantined()[TASKS[0]].startswith("flaky:")   # identical actions, pass and fail


def test_tasks_that_failed_validation_are_quarantined_with_the_validator_reasons(cur, tmp_path):
    import json
    path = tmp_path / "quarantine.json"
    path.write_text(json.dumps({TASKS[1]: {"name": "a", "reasons": ["reference fails: x"]},
                                "python/b": {"task_id": TASKS[2], "reasons": ["null passes"]},
                                "sha256:" + "f" * 64: {"reasons": ["not ours"]}}))
    assert cur.import_validation(path) == 2
    q = cur.quarantined()
    assert q[TASKS[1]] == "broken: validation: reference fails: x"
    assert q[TASKS[2]] == "broken: validation: null passes"
    assert cur.import_validation(tmp_path / "missing.json") == 0


def test_cli_shows_classes_estimates_and_quarantine_reasons(tmp_path):
    import io

    from controller.cli.main import build_parser
    from controller.taskbank.bank import TaskBank, make_set
    from controller.taskbank.builtin import builtin_taskset
    tasks = builtin_taskset().tasks[:3]
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(make_set("s", tasks))
    with Curriculum(bank.root / "curriculum.sqlite", [t.task_id for t in tasks]) as c:
        _feed(c, tasks[0].task_id, 2, 5, 5)
        c.quarantine(tasks[1].task_id, "broken: manual")
    out = io.StringIO()
    args = build_parser().parse_args(["tasks", "--bank", str(bank.root), "curriculum", "s"])
    assert args.func(args, out=out) == 0
    text = out.getvalue()
    assert text.startswith("policy version 2: band 1, explore 1, too_easy 0, too_hard 0, quarantined 1")
    assert f"quarantined  0.50 (evidence   0.0)  {tasks[1].name}  broken: manual" in text


@pytest.mark.parametrize("per_version", [1, 2, 4])
def test_the_local_run_config_leaves_explore_within_four_versions(tmp_path, per_version):
    """The local run records `rollouts_per_task` outcomes per task per version and samples the
    next version before its own outcomes exist: the evidence must reach min_evidence anyway."""
    from controller.demo.localrun import RunConfig, local_curriculum_config
    cfg = local_curriculum_config(RunConfig(rollouts_per_task=per_version))
    with Curriculum(tmp_path / "c.sqlite", TASKS, cfg) as c:
        classes = []
        for version in range(5):
            classes.append(set(c.classify(version).values()))
            for t in TASKS:
                _feed(c, t, version, passes=per_version if t < TASKS[5] else 0,
                      fails=0 if t < TASKS[5] else per_version)
    assert classes[0] == {"explore"}
    assert "explore" not in classes[4], classes


# -- the sampler at scale: cached classes kept up to date, a lazy universe -------------------

def test_the_sampler_classes_kept_up_to_date_equal_a_fresh_classification(tmp_path):
    """Random outcomes, quarantines and releases across versions and bands: after each step
    the sampler's cached classes agree with classify() computed from the tables."""
    rng = random.Random(5)
    tasks = [f"t{i:03d}" for i in range(40)]
    with Curriculum(tmp_path / "c.sqlite", tasks) as c:
        bands = [None, (0.1, 0.5), (0.5, 0.9)]
        for step in range(400):
            r = rng.random()
            t = rng.choice(tasks)
            if r < 0.8:
                c.record(t, rng.randint(0, 5), rng.choice(["pass", "fail", "timeout"]),
                         solution_hash=rng.choice([None, "h1", "h2"]), rollout_id=f"r{step}")
            elif r < 0.9:
                c.quarantine(t, "by hand")
            else:
                c.release(t)
            version, band = rng.randint(0, 6), rng.choice(bands)
            cached = c._touched_classes(version, band)
            fresh = c.classify(version, band)
            assert {x: cached.get(x, "explore") for x in tasks} == fresh, f"step {step}"
            c.sample(7, random.Random(step), version, within=band)
            # what a sample reads is kept up to date with the classes, not recomputed
            entry = c._entry(version, band)
            assert sorted(entry.band.items) == sorted(t for t, k in fresh.items() if k == "band"), f"step {step}"
            assert all(entry.band.items[i] == t for t, i in entry.band.pos.items())
            assert len(tasks) - entry.not_explore == sum(k == "explore" for k in fresh.values()), f"step {step}"
            if entry.explore is not None:
                assert sorted(entry.explore.items) == sorted(t for t, k in fresh.items() if k == "explore")


class _LazyIds:
    """A sequence that counts how many ids were read (what a task index's `ids` is)."""

    def __init__(self, n: int):
        self.n, self.reads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.reads += 1
        return f"task{i:08d}"

    def __contains__(self, t):
        return isinstance(t, str) and t.startswith("task") and 0 <= int(t[4:]) < self.n

    def __iter__(self):
        raise AssertionError("the sampler listed every task")


def test_a_large_task_set_is_sampled_without_listing_it(tmp_path):
    import collections.abc
    collections.abc.Sequence.register(_LazyIds)
    ids = _LazyIds(1_200_000)
    with Curriculum(tmp_path / "c.sqlite", ids) as c:
        for i in range(50):
            _feed(c, f"task{i:08d}", 0, 2, 2)            # 50 tasks in the band, the rest unseen
        picks = c.sample(256, random.Random(3), 0)
        assert len(picks) == 256 and ids.reads < 2_000, "drawn by position, not listed"
        band = [p for p in picks if int(p[4:]) < 50]
        explore = [p for p in picks if int(p[4:]) >= 50]
        assert len(explore) == round(256 * c.cfg.explore_share) and len(set(explore)) == len(explore)
        assert len(band) == 256 - len(explore)
        assert picks == c.sample(256, random.Random(3), 0), "seeded: the same picks"


class _NoWalk(dict):
    """A task-class map a sample may look up but not walk."""

    def _walk(self, *_a):
        raise AssertionError("the sampler walked every task with a record")
    items = values = keys = __iter__ = _walk


def test_a_sample_costs_the_same_however_many_tasks_have_a_record(tmp_path):
    """Late in a long run most tasks have a record: a sample must not walk them (it sorted the
    band's tasks and counted the explore pool's on every call: 24 ms at 100,000 tasks with a
    record, 140 ms at 600,000). The band's members and the explore pool's size are kept with
    the classes; outcomes recorded between samples move tasks in and out of them."""
    tasks = [f"t{i:04d}" for i in range(4000)]
    with Curriculum(tmp_path / "c.sqlite", tasks) as c:
        for i, t in enumerate(tasks[:3000]):
            _feed(c, t, 0, passes=1 + i % 3, fails=2)   # band and too_hard/too_easy, the rest unseen
        c.sample(64, random.Random(0), 0)
        entry = c._entry(0, None)
        entry.classes = _NoWalk(entry.classes)
        for k in range(40):   # outcomes of tasks with a record and of unseen ones
            t = tasks[(k * 137) % 4000]
            for j in range(3):
                c.record(t, 0, "pass" if (k + j) % 3 else "fail", rollout_id=f"late-{k}-{j}")
            picks = c.sample(64, random.Random(k), 0)
            assert len(picks) == 64
        band = {t for t, k in dict.items(entry.classes) if k == "band"}
        assert set(entry.band.items) == band and len(band) > 100
        picks = c.sample(1000, random.Random(1), 0)
        assert set(picks) - band and all(t in band or dict.get(entry.classes, t, "explore") == "explore"
                                         for t in picks)


def test_a_slow_set_up_or_grading_is_held_against_the_task_a_slow_node_never(cur):
    for _ in range(3):
        cur.record_infra_failure(TASKS[3], "deadline: setup: the setup phase ran past its 5s deadline")
        cur.record_infra_failure(TASKS[4], "deadline: create: the create phase ran past its 5s deadline")
        cur.record_infra_failure(TASKS[5], "deadline: total (verify): the attempt ran past its 60s end-to-end deadline")
        cur.record_infra_failure(TASKS[6], "deadline: teardown: the teardown phase ran past its 1s deadline")
    assert set(cur.quarantined()) == {TASKS[3]}
