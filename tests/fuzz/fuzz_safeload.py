"""Atheris fuzz target for the bounded parsers (`controller.contracts.safeload`).

`python tests/fuzz/fuzz_safeload.py yaml|json|jsonl -atheris_runs=N`. Inputs are random text
with YAML/JSON fragments mixed in (anchors, aliases, brackets, quotes, escapes). Properties:
1. each parser returns a value or raises `ParseLimitError`, never anything else;
2. a ParseLimitError's message starts with the source name;
3. JSON: what the bounded parser accepts equals `json.loads` of the same text;
4. YAML: what the bounded parser accepts equals `yaml.safe_load` of the same text.
(`tests/fuzz/test_safeload_fuzz.py` runs each for a bounded number of inputs.)
"""
from __future__ import annotations

import io
import json
import sys

import atheris

with atheris.instrument_imports(include=["controller.contracts.safeload"]):
    from controller.contracts import safeload

import yaml

BOUNDS = safeload.Bounds(max_bytes=4096, max_line_bytes=512, max_depth=8, max_aliases=4, max_nodes=200)
FRAGMENTS = ("&a ", "*a", "&b ", "*b", "[", "]", "{", "}", ", ", ": ", "- ", "\n", "\n  ", '"', "\\",
             "'", "1", "-2.5e3", "true", "null", "x", "!!str ", "!!python/object:os.system ", "<<: ",
             "? ", "|", ">", "#", "---\n", "...\n", "\t", "\\u00e9", "NaN", "Infinity")
SOURCE = "fuzz.src"


def _text(fdp: atheris.FuzzedDataProvider) -> str:
    parts = []
    for _ in range(fdp.ConsumeIntInRange(0, 40)):
        if fdp.ConsumeBool():
            parts.append(FRAGMENTS[fdp.ConsumeIntInRange(0, len(FRAGMENTS) - 1)])
        else:
            parts.append(fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 6)))
    return "".join(parts)


def _refusal_named(exc: safeload.ParseLimitError) -> None:
    assert str(exc).startswith(SOURCE), str(exc)


def check_yaml(text: str) -> None:
    try:
        value = safeload.load_yaml_text(text, SOURCE, BOUNDS)
    except safeload.ParseLimitError as exc:
        _refusal_named(exc)
        return
    try:
        plain = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        raise AssertionError(f"accepted what yaml.safe_load refuses: {text!r}")
    if value == value:        # NaN compares unequal to itself
        assert value == plain or repr(value) == repr(plain), (text, value, plain)


def check_json(text: str) -> None:
    try:
        value = safeload.load_json_text(text, SOURCE, BOUNDS)
    except safeload.ParseLimitError as exc:
        _refusal_named(exc)
        return
    assert repr(value) == repr(json.loads(text)), text


def check_jsonl(text: str) -> None:
    try:
        for lineno, _value in safeload.iter_jsonl(io.StringIO(text), SOURCE, BOUNDS):
            assert lineno >= 1
    except safeload.ParseLimitError as exc:
        _refusal_named(exc)


CHECKS = {"yaml": check_yaml, "json": check_json, "jsonl": check_jsonl}


def main(argv: list[str]) -> None:
    check = CHECKS[argv.pop(1)]

    def one(data: bytes) -> None:
        check(_text(atheris.FuzzedDataProvider(data)))

    atheris.Setup(argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
