"""Red team s13m B3/B7: checker deadlines must be finite and sane; duplicate YAML/JSON keys are
refused naming the key (the last one silently winning changed a task's gold)."""
from __future__ import annotations

import pytest

from controller.contracts.checkerspec import SpecError, validate_spec
from controller.contracts.safeload import ParseLimitError, load_json_text, load_yaml_text


@pytest.mark.parametrize("key,value", [("timeout_s", float("nan")), ("timeout_s", float("inf")),
                                       ("timeout_s", 1e308), ("timeout_s", 86401)])
def test_a_checker_deadline_must_be_finite_and_within_a_day(key, value):
    with pytest.raises(SpecError, match=f"checker.{key}"):
        validate_spec({"kind": "math", "answer": "5", key: value})


def test_a_judge_number_must_be_finite():
    judge = {"endpoint": "node:j", "model": "m", "rubric": "r", "timeout_s": float("nan")}
    with pytest.raises(SpecError, match="checker.judge.timeout_s"):
        validate_spec({"kind": "math", "answer": "5", "judge": judge})


def test_a_sane_deadline_and_a_blank_math_gold():
    assert validate_spec({"kind": "math", "answer": "5", "timeout_s": 30})["timeout_s"] == 30
    with pytest.raises(SpecError, match="blank"):
        validate_spec({"kind": "math", "answer": "   "})


@pytest.mark.parametrize("text,key", [("a: 1\nb: 2\na: 3\n", "'a'"),
                                      ("checker: {kind: math, answer: '5', answer: '6'}\n", "'answer'")])
def test_a_duplicate_yaml_key_is_refused_naming_it(text, key):
    with pytest.raises(ParseLimitError, match=f"duplicate key {key}"):
        load_yaml_text(text, "task.yaml")


def test_yaml_merge_keys_may_still_be_overridden():
    assert load_yaml_text("b: &x {a: 1, c: 2}\nd:\n  <<: *x\n  a: 5\n")["d"] == {"a": 5, "c": 2}


def test_a_duplicate_json_key_is_refused_naming_it():
    with pytest.raises(ParseLimitError, match="duplicate key 'answer'"):
        load_json_text('{"q": {"answer": "5", "answer": "6"}}', "x.json")
    assert load_json_text('{"a": {"a": 1}}') == {"a": {"a": 1}}
