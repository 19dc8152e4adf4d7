"""Bounded parsers for untrusted YAML, JSON and JSON lines: every reader of a task package, a
dataset, a manifest or a config file goes through here.

An untrusted file must not be able to take the host down by its shape. Each parser refuses,
with a `ParseLimitError` naming the file, the line and the limit:

  YAML   more than `max_bytes` of text; more than `max_aliases` alias uses (`*name`); a
         document whose aliases expand to more than `max_nodes` nodes (the billion-laughs
         bomb: nine aliases of nine aliases ... is small on disk, 10^9 nodes once walked);
         nesting deeper than `max_depth`. Only plain data (yaml.SafeLoader's types).
  Both   a key written twice in one mapping (the last would win silently).
  JSON   more than `max_bytes`; nesting deeper than `max_depth` (checked before parsing, so
         the C parser never recurses that far).
  JSONL  a line longer than `max_line_bytes` (read with a bounded readline: a 10 GB line
         costs `max_line_bytes` of memory, not 10 GB); each record as JSON above.

The defaults fit every honest input Paddock reads (a task.yaml, a SWE-bench record with its
patches, a run's config) with orders of magnitude to spare; a caller with a reason passes its
own `Bounds`. Must not import: zmq, sqlite3, nodeagent, controller.broker.
"""
from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

import yaml

MIB = 1 << 20


@dataclass(frozen=True)
class Bounds:
    max_bytes: int = 64 * MIB            # a whole YAML / JSON document
    max_line_bytes: int = 64 * MIB       # one JSONL record
    max_depth: int = 64                  # nesting of mappings and sequences
    max_aliases: int = 64                # YAML alias uses in one document
    max_nodes: int = 1_000_000           # YAML nodes after expanding every alias


DEFAULT = Bounds()


class ParseLimitError(ValueError):
    """An input refused by a bound or by its syntax; the message names file, line and limit."""

    def __init__(self, source: str, line: int | None, detail: str):
        self.source, self.line, self.detail = source, line, detail
        where = f"{source}:{line}" if line is not None else str(source)
        super().__init__(f"{where}: {detail}")


# -- YAML -----------------------------------------------------------------------------------

class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts alias uses while composing (before anything is constructed)."""

    bounds: Bounds = DEFAULT
    source: str = "<yaml>"

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent, index):  # noqa: D401 - PyYAML's hook
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self.bounds.max_aliases:
                line = self.peek_event().start_mark.line + 1
                raise ParseLimitError(self.source, line, f"more than {self.bounds.max_aliases} YAML "
                                      f"aliases (limit max_aliases; an alias bomb?)")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # noqa: D401 - PyYAML's hook
        # A key written twice is refused (PyYAML keeps the last silently: a second `checker:`
        # would change the gold a reviewer read). Merge keys (`<<`) may be overridden.
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    duplicate = key in seen
                except TypeError:
                    continue
                if duplicate:
                    raise ParseLimitError(self.source, key_node.start_mark.line + 1,
                                          f"duplicate key {key!r} (a key may appear once in a mapping)")
                seen.add(key)
        return super().construct_mapping(node, deep)


def _check_expansion(node: yaml.Node, bounds: Bounds, source: str) -> None:
    """Nodes and depth of `node` with every alias expanded, memoised per node object so a bomb
    is measured in time linear in its size on disk."""
    sizes: dict[int, tuple[int, int]] = {}

    def walk(n: yaml.Node, depth_above: int) -> tuple[int, int]:
        if depth_above > bounds.max_depth:
            raise ParseLimitError(source, n.start_mark.line + 1,
                                  f"nesting deeper than {bounds.max_depth} (limit max_depth)")
        key = id(n)
        if key in sizes:
            return sizes[key]
        if isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            children = list(n.value)
        else:
            children = []
        total, depth = 1, 0
        for c in children:
            c_total, c_depth = walk(c, depth_above + 1)
            total += c_total
            depth = max(depth, c_depth + 1)
            if total > bounds.max_nodes:
                raise ParseLimitError(source, n.start_mark.line + 1,
                                      f"expands to more than {bounds.max_nodes} nodes "
                                      f"(limit max_nodes; an alias bomb?)")
        sizes[key] = (total, depth)
        return total, depth

    walk(node, 0)


def load_yaml_text(text: str, source: str = "<yaml>", bounds: Bounds = DEFAULT) -> Any:
    """Plain data of one YAML document, bounded (see the module docstring)."""
    if len(text) > bounds.max_bytes:
        raise ParseLimitError(source, None, f"larger than {bounds.max_bytes} bytes (limit max_bytes)")
    loader_cls = type("Loader", (_BoundedLoader,), {"bounds": bounds, "source": source})
    try:
        loader = loader_cls(text)     # the reader checks characters here already
    except yaml.YAMLError as exc:
        raise ParseLimitError(source, None, f"not valid YAML: {exc}") from None
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ParseLimitError(source, None, f"nesting deeper than {bounds.max_depth} "
                                  "(limit max_depth)") from None
        if node is None:
            return None
        _check_expansion(node, bounds, source)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ParseLimitError(source, line, f"not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ParseLimitError(source, None, f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def load_yaml(path: str | os.PathLike, bounds: Bounds = DEFAULT) -> Any:
    """`load_yaml_text` of a file, reading at most max_bytes + 1 bytes of it."""
    text = _read_bounded(Path(path), bounds.max_bytes)
    return load_yaml_text(text, str(path), bounds)


# -- JSON -----------------------------------------------------------------------------------

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """Greatest nesting of [ and { in JSON text (strings skipped), at C speed."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)))


class _DuplicateKey(Exception):
    """A JSON object names a key twice (not a ValueError: json.loads must not wrap it)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def load_json_text(text: str | bytes, source: str = "<json>", bounds: Bounds = DEFAULT,
                   line: int | None = None, max_bytes: int | None = None) -> Any:
    """One JSON document, bounded in size and nesting. `line`: the line of a JSONL record."""
    limit = bounds.max_bytes if max_bytes is None else max_bytes
    if len(text) > limit:
        raise ParseLimitError(source, line, f"larger than {limit} bytes (limit max_bytes)")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseLimitError(source, line, f"not UTF-8: {exc}") from None
    if json_depth(text) > bounds.max_depth:
        raise ParseLimitError(source, line, f"nesting deeper than {bounds.max_depth} (limit max_depth)")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ParseLimitError(source, line, f"duplicate key {exc.args[0]!r} (a key may appear once "
                              "in an object)") from None
    except ValueError as exc:
        at = line if line is not None else getattr(exc, "lineno", None)
        raise ParseLimitError(source, at, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise ParseLimitError(source, line, f"nesting deeper than {bounds.max_depth} "
                              "(limit max_depth)") from None


def load_json(path: str | os.PathLike, bounds: Bounds = DEFAULT) -> Any:
    """`load_json_text` of a file, reading at most max_bytes + 1 bytes of it."""
    return load_json_text(_read_bounded(Path(path), bounds.max_bytes), str(path), bounds)


def iter_jsonl(stream: IO[str], source: str, bounds: Bounds = DEFAULT) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a text stream, each line read with a
    bounded readline (a line longer than max_line_bytes is refused without being held)."""
    for lineno in itertools.count(1):
        line = stream.readline(bounds.max_line_bytes + 1)
        if not line:
            return
        if len(line) > bounds.max_line_bytes and not line.endswith("\n"):
            raise ParseLimitError(source, lineno, f"line longer than {bounds.max_line_bytes} "
                                  "characters (limit max_line_bytes)")
        if not line.strip():
            continue
        yield lineno, load_json_text(line, source, bounds, line=lineno, max_bytes=bounds.max_line_bytes + 1)


def load_jsonl(path: str | os.PathLike, bounds: Bounds = DEFAULT) -> list[Any]:
    """Every record of a plain UTF-8 JSONL file (see `iter_jsonl`)."""
    with open(path, encoding="utf-8") as f:
        try:
            return [rec for _n, rec in iter_jsonl(f, str(path), bounds)]
        except UnicodeDecodeError as exc:
            raise ParseLimitError(str(path), None, f"not UTF-8: {exc}") from None


def _read_bounded(path: Path, max_bytes: int) -> str:
    chunks, held = [], 0
    with open(path, "rb") as f:      # in chunks: read(n) would allocate n bytes up front
        while held <= max_bytes:
            chunk = f.read(min(1 << 20, max_bytes + 1 - held))
            if not chunk:
                break
            chunks.append(chunk)
            held += len(chunk)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise ParseLimitError(str(path), None, f"larger than {max_bytes} bytes (limit max_bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ParseLimitError(str(path), line, f"not UTF-8: {exc.reason} at byte {exc.start}") from None


__all__ = ["Bounds", "DEFAULT", "ParseLimitError", "load_yaml", "load_yaml_text", "load_json",
           "load_json_text", "iter_jsonl", "load_jsonl", "json_depth"]
