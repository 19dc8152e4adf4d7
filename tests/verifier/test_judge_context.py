"""What the agent controls cannot keep a passing rollout from its judge score, nor choose what
the judge reads (red team s11 §6, §7): the artifact fits the judge's context in tokens, every
changed path is listed, the task's own files come first and the answer's share is capped; a
context overflow is never retried as is, and never `judge_failed` when cutting the artifact
fits. The judge is a fake model server on loopback (outside Paddock) that refuses, with
llama.cpp's 400 body, any prompt over its context, estimated as the red team did."""
from __future__ import annotations

import json

import pytest

from controller.contracts.checkerspec import CheckerSpec
from controller.contracts.tasks import GradedTask
from nodeagent.sandbox.runtime import Change
from nodeagent.verifier import grade, judge
from nodeagent.verifier.judge import JudgeService
from tests.conftest import FakeChatServer, FakeClock

REF = "def reverse_words(s):\n    return ' '.join(reversed(s.split()))  # MARK-SOLUTION\n"


def _tokens(text: str) -> int:
    return sum(1 for c in text if ord(c) < 128) // 4 + sum(1 for c in text if ord(c) >= 128)


class ContextJudge(FakeChatServer):
    """Scores 1; refuses a prompt over `ctx` estimated tokens as llama.cpp does (or `status`)."""

    def __init__(self, ctx: int = 8192, status: int | None = None):
        def answer(req):
            n = _tokens(req["messages"][0]["content"])
            if status is not None:
                return status, "no"
            if n > ctx:
                return 400, json.dumps({"error": {"code": 400, "message": f"request ({n} tokens) exceeds the "
                                                  f"available context size ({ctx} tokens)",
                                                  "type": "exceed_context_size_error"}})
            return 200, "fine\nSCORE: 1"
        super().__init__(answer, model="judge")

    def prompts(self) -> list[str]:
        return [r["messages"][0]["content"] for r in self.requests]


@pytest.fixture
def service():
    clock = FakeClock()
    return JudgeService(clock=clock, sleep=clock.advance)


def _task(fake, sees="answer", rubric="Is the code in /work/solution.py clean?") -> GradedTask:
    return GradedTask(name="python/reverse_words", instruction="Write reverse_words in /work/solution.py.",
                      files={"solution.py": "def reverse_words(s):\n    raise NotImplementedError\n"},
                      checker=CheckerSpec(kind="exact", answer="x", judge={
                          "endpoint": fake.url, "model": "judge", "rubric": rubric, "sees": sees,
                          "weight": 0.5, "max_retries": 3}))


def _judged(fake, service, changes, answer, sees="answer", conversation=None, rubric=None):
    v = grade.Verdict("pass", 1.0, {"correct": 1.0})
    task = _task(fake, sees) if rubric is None else _task(fake, sees, rubric)
    judge.apply(v, task, changes, answer, conversation, lambda: 0.0, service)
    return v


SOLUTION = Change("/work/solution.py", "modified", REF.encode(), 0o644)
DECOYS = [Change(f"/work/.a{i:02d}.txt", "added", b"decoy " * 700, 0o644) for i in range(20)]


@pytest.mark.parametrize("answer", ["done " + "x" * 24000, "done " + "\u4e00" * 20000, "\U0001F600" * 60000])
def test_a_padded_answer_is_judged_and_the_code_is_shown(service, answer):
    fake = ContextJudge()
    try:
        v = _judged(fake, service, [SOLUTION], answer)
    finally:
        fake.close()
    assert v.outcome == "pass" and v.components["judge"] == 1.0, v.checks[-1]
    assert "MARK-SOLUTION" in fake.prompts()[-1]


def test_decoy_files_sorting_first_do_not_push_the_tasks_file_out(service):
    fake = ContextJudge()
    many = DECOYS + [Change(f"/work/a{i:04d}.txt", "added", b"decoy " * 50, 0o644) for i in range(2000)]
    try:
        v = _judged(fake, service, [*many, SOLUTION], "done")
    finally:
        fake.close()
    prompt = fake.prompts()[-1]
    assert v.outcome == "pass" and "MARK-SOLUTION" in prompt
    assert "/work/solution.py" in prompt.split("File changes:")[0]      # listed among the changed paths
    assert f"Changed paths ({len(many) + 1})" in prompt and "more paths not listed" in prompt


def test_every_changed_path_is_listed_when_they_fit(service):
    fake = ContextJudge()
    try:
        _judged(fake, service, [*DECOYS, SOLUTION], "done")
    finally:
        fake.close()
    listing = fake.prompts()[-1].split("File changes:")[0]
    assert all(c.path in listing for c in [*DECOYS, SOLUTION])


def test_a_padded_transcript_is_judged(service):
    fake = ContextJudge()
    conv = {"transcript": [{"role": "user", "content": "Can you move my team sync?"},
                           {"role": "assistant", "content": "Team sync is now on 2026-03-04 at 11:00. "
                            + "\u4e00" * 20000}]}
    try:
        v = _judged(fake, service, [], None, sees="trajectory", conversation=conv)
    finally:
        fake.close()
    assert v.outcome == "pass" and v.components["judge"] == 1.0
    assert "Team sync is now on 2026-03-04" in fake.prompts()[-1]


def test_a_judge_smaller_than_assumed_gets_a_cut_artifact_without_retries(service):
    """The server's 400 is deterministic: it is not retried as is; the artifact is cut to fit."""
    fake = ContextJudge(ctx=2500)
    try:
        v = _judged(fake, service, [SOLUTION], "done " + "x" * 24000)
    finally:
        fake.close()
    assert v.outcome == "pass" and v.components["judge"] == 1.0
    sizes = [_tokens(p) for p in fake.prompts()]
    assert len(sizes) <= 3 and sizes == sorted(sizes, reverse=True) and sizes[-1] <= 2500


def test_a_prompt_that_overflows_without_the_artifact_is_judge_failed(service):
    """Not the agent's doing (the task's rubric fills the context): judge_failed, few calls."""
    fake = ContextJudge(ctx=100)
    try:
        v = _judged(fake, service, [SOLUTION], "done", rubric="Be thorough. " * 400)
    finally:
        fake.close()
    assert (v.outcome, v.reward) == ("judge_failed", None) and len(fake.requests) <= judge.MAX_SHRINKS + 1


def test_a_client_error_is_not_retried(service):
    fake = ContextJudge(status=401)
    try:
        v = _judged(fake, service, [SOLUTION], "done")
    finally:
        fake.close()
    assert v.outcome == "judge_failed" and len(fake.requests) == 1
