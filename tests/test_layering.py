"""The layout's rules, read from the code's own imports (`ast`), so the map in docs/internals.md
cannot drift from the code:

- no import circle between the project's modules (imports inside functions count too: a lazy
  import that closes a circle is still a circle);
- the node agent and `layers` import nothing of the controller but the shared floor:
  `controller.contracts` (the vocabulary) and `controller.ondisk` (the shared on-disk formats);
- `controller.contracts` is a leaf: it imports nothing else of the project, and writes no file;
  `controller.ondisk` imports only the vocabulary;
- `slurm` imports neither the demo nor the CLI; local run and Slurm head share one assembler;
- only the CLI (`controller.cli`) and `slurm` import the node agent from outside it;
- every "Must not import: a, b." line in a module or package docstring holds.

Imports under `if TYPE_CHECKING:` are not imports at run time and are left out.
"""
from __future__ import annotations

import ast
import re
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controller", "nodeagent", "layers", "slurm")
STDLIB = set(sys.stdlib_module_names)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_pkg: bool):
    """(imported dotted name, line, at module level?) for every import statement."""
    out = []

    def visit(node, top: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), top)
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg_parts = module.split(".") if is_pkg else module.split(".")[:-1]
                    pkg_parts = pkg_parts[:len(pkg_parts) - (child.level - 1)]
                    base = ".".join(pkg_parts + ([base] if base else []))
                for a in child.names:
                    out.append((f"{base}.{a.name}" if a.name != "*" else base, child.lineno, top))
            inner_top = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner_top)

    visit(tree, True)
    return out


def _resolve(name: str) -> str | None:
    """The project module an imported dotted name refers to (longest known prefix)."""
    mods = modules()
    while name:
        if name in mods:
            return name
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


@lru_cache(maxsize=1)
def graph() -> dict[str, list[tuple[str, int, bool]]]:
    edges: dict[str, list[tuple[str, int, bool]]] = {}
    for mod, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        lst = []
        for name, line, top in _imports(tree, mod, path.name == "__init__.py"):
            target = _resolve(name)
            if target and target != mod:
                lst.append((target, line, top))
        edges[mod] = lst
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def _package_parents(mod: str) -> set[str]:
    parts = mod.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_the_project_has_no_import_circles():
    # A package's __init__ importing its own submodules (re-exports) is not a circle of
    # responsibilities; imports of a parent package's __init__ are left out for that reason.
    edges = {m: {t for t, _l, _top in lst if t not in _package_parents(m)} for m, lst in graph().items()}
    assert _cycles(edges) == []


SHARED = ("controller.contracts", "controller.ondisk")   # the floor every part may stand on


@pytest.mark.parametrize("part", ["nodeagent", "layers"])
def test_the_node_agent_and_layers_import_of_the_controller_only_the_shared_floor(part):
    """The vocabulary (controller.contracts) and the shared on-disk formats (controller.ondisk)."""
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items() if _within(m, part)
           for t, line, _top in lst if _within(t, "controller") and not any(_within(t, s) for s in SHARED)]
    assert bad == []


def test_slurm_imports_of_the_controller_only_the_floor_and_the_run_assembler():
    """The Slurm steps assemble a run as the local run does (controller.farm) and talk to the
    controller as a client; they never reach into its daemon's parts but what they must read
    (the analyst's summary, the daemon's stopped-endpoint suffix)."""
    allowed = SHARED + ("controller.farm", "controller.client", "controller.analysis.query",
                        "controller.broker.daemon")
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items() if _within(m, "slurm")
           for t, line, _top in lst if _within(t, "controller") and not any(_within(t, a) for a in allowed)]
    assert bad == []


def test_the_contracts_are_a_leaf():
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items() if _within(m, "controller.contracts")
           for t, line, _top in lst if not _within(t, "controller.contracts")]
    assert bad == []


def test_the_on_disk_formats_stand_only_on_the_vocabulary():
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items() if _within(m, "controller.ondisk")
           for t, line, _top in lst if not any(_within(t, s) for s in SHARED)]
    assert bad == []


# What writing a file looks like in Python: calls of these names (os.replace, Path.write_text,
# tempfile.mkstemp, ...) or open() with a mode that writes.
WRITING_CALLS = {"write_text", "write_bytes", "replace", "rename", "fsync", "mkdir", "makedirs", "chmod",
                 "unlink", "remove", "rmtree", "mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory",
                 "symlink", "link", "truncate"}


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in WRITING_CALLS and not (name == "replace" and isinstance(f, ast.Attribute)
                                          and not (isinstance(f.value, ast.Name) and f.value.id == "os")):
            out.append((node.lineno, name))
        if name == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if mode is not None and not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)
                                         and not set(mode.value) & set("wax+")):
                out.append((node.lineno, f"open(mode={ast.unparse(mode)})"))
    return out


def test_the_vocabulary_writes_no_files():
    """controller.contracts is words only: the writers of shared files live in controller.ondisk."""
    bad = [f"{m}:{line} {what}" for m, path in modules().items() if _within(m, "controller.contracts")
           for line, what in _writes(ast.parse(path.read_text(), str(path)))]
    assert bad == []


def test_the_write_check_sees_the_writers_that_moved_out():
    """The check above is not blind: it finds the writes of controller.ondisk."""
    found = {m for m, path in modules().items() if _within(m, "controller.ondisk")
             and _writes(ast.parse(path.read_text(), str(path)))}
    assert {"controller.ondisk.fileio", "controller.ondisk.keys", "controller.ondisk.taskblobs"} <= found


def test_only_the_cli_and_slurm_import_the_node_agent():
    allowed = ("nodeagent", "controller.cli", "slurm")
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items()
           if not any(_within(m, a) for a in allowed)
           for t, line, _top in lst if _within(t, "nodeagent")]
    assert bad == []


_MUST_NOT = re.compile(r"must not import:?\s*(.+?)(?:\.\s|\.$|$)", re.IGNORECASE | re.DOTALL)
_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_EXCEPT = re.compile(rf"({_NAME})(?:\.\*)?\s+(?:other than|outside|except|but)\s+(.+)")
PROJECT = "Paddock"   # "anything of Paddock": every package of the project


def _strip_parens(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        depth += ch == "("
        if depth == 0:
            out.append(ch)
        depth -= ch == ")" and depth > 0
    return "".join(out)


def _rules(doc: str) -> list[tuple[str, tuple[str, ...]]]:
    """The (forbidden name, exceptions) pairs of a docstring's "Must not import: a, b." lines.
    Grammar: items separated by commas, semicolons, "or", "and", "nor"; an item is a dotted
    name (`controller.*` = `controller`), "X other than Y" / "X outside Y" (Y may be
    "Y1 and Y2", relative to X), or "anything of Paddock". Parenthesised text is a reason."""
    out = []
    for m in _MUST_NOT.finditer(doc):
        text = " ".join(_strip_parens(m.group(1)).split())
        for chunk in re.split(r",|;|\bor\b|\bnor\b", text):
            chunk = chunk.strip()
            e = _EXCEPT.fullmatch(chunk.strip("`"))
            if e:
                base = PROJECT if e.group(1).lower() == "paddock" else e.group(1)
                exc = [x.strip().strip("`").removesuffix(".*") for x in re.split(r"\band\b", e.group(2))]
                out.append((base, tuple(x if base == PROJECT or _within(x, base) else f"{base}.{x}"
                                        for x in exc if x)))
                continue
            for tok in re.split(r"\band\b", chunk):
                tok = tok.strip().strip("`").strip()
                if not tok:
                    continue
                if tok.lower() in ("anything of paddock", "paddock", "anything of the project"):
                    out.append((PROJECT, ()))
                else:
                    out.append((tok.removesuffix(".*"), ()))
    return out


def _forbidden(doc: str) -> list[str]:
    return [name for name, _exc in _rules(doc)]


def _docstrings() -> dict[str, str]:
    docs = {}
    for mod, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
        docs[mod] = doc
    return docs


def test_every_must_not_import_line_names_modules():
    """Each forbidden name is a dotted module name (of the project or an installed library),
    so the rule can be checked; prose such as "anything with I/O" cannot be."""
    bad = []
    for mod, doc in _docstrings().items():
        for name, exc in _rules(doc):
            for tok in (name, *exc):
                if tok != PROJECT and not re.fullmatch(_NAME, tok):
                    bad.append(f"{mod}: {tok!r}")
    assert bad == []


def _breaks(rule: tuple[str, tuple[str, ...]], name: str) -> bool:
    base, exceptions = rule
    targets = PACKAGES if base == PROJECT else (base,)
    return any(_within(name, t) for t in targets) and not any(_within(name, e) for e in exceptions)


def test_every_must_not_import_line_holds():
    docs = _docstrings()
    bad = []
    for mod in graph():
        rules = set(_rules(docs[mod]))
        for parent in _package_parents(mod):       # a package's rules bind its modules
            rules |= set(_rules(docs.get(parent, "")))
        rules = {r for r in rules if not (r[0] != PROJECT and _within(mod, r[0]))}
        if not rules:
            continue
        path = modules()[mod]
        for name, line, _top in _imports(ast.parse(path.read_text(), str(path)), mod, path.name == "__init__.py"):
            resolved = _resolve(name) or name
            for rule in sorted(rules):
                if _breaks(rule, name) or _breaks(rule, resolved):
                    bad.append(f"{mod}:{line} imports {name} (its docstring says: must not import {rule[0]}"
                               + (f" other than {', '.join(rule[1])}" if rule[1] else "") + ")")
    assert bad == []


@pytest.mark.parametrize("limit", [700])
def test_no_module_is_far_over_six_hundred_lines(limit):
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > limit}
    assert long == {}


def test_nothing_but_entry_points_imports_the_cli():
    """The CLI is the front floor: libraries never import it; only `__main__` modules (thin
    `python -m` entry points) may. The Slurm job steps start `paddock controller|agent` as
    processes, as the local run does."""
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items()
           if not (_within(m, "controller.cli") or m.endswith(".__main__"))
           for t, line, _top in lst if _within(t, "controller.cli")]
    assert bad == []


def test_slurm_imports_neither_the_demo_nor_the_cli():
    """The Slurm job is the production path: it assembles its run with controller.farm (as the
    local run does) and runs the built-in trainer as a command, never the demo in its process."""
    bad = [f"{m}:{line} imports {t}" for m, lst in graph().items() if _within(m, "slurm")
           for t, line, _top in lst if _within(t, "controller.demo") or _within(t, "controller.cli")]
    assert bad == []


def test_one_run_assembler():
    """The local run and the Slurm head step build their run with controller.farm.assemble, and
    it imports neither of them (nor the demo, the CLI or the node agent)."""
    edges = graph()
    users = {m for m, lst in edges.items() for t, _l, _top in lst if t == "controller.farm.assemble"}
    assert {"controller.demo.localrun", "slurm.jobsteps"} <= users
    bad = [t for m, lst in edges.items() if _within(m, "controller.farm") for t, _l, _top in lst
           if any(_within(t, x) for x in ("controller.demo", "controller.cli", "nodeagent", "slurm"))]
    assert bad == []


# Imports inside functions that are there for a reason other than an import circle.
LAZY_IMPORTS = {
    "controller.broker.daemon": {"controller.broker.metrics"},   # prometheus_client only with --metrics-port
    # the shard tables' Arrow schemas: only compaction needs them, not the controller's start
    "controller.store.catalog": {"controller.contracts.trajectory"},
}


def test_imports_inside_functions_are_only_for_start_up_time():
    """A project import inside a function dodges a circle or delays a load. Circles are gone;
    the CLI delays loads so `paddock X` starts only what X needs; elsewhere each one is listed
    in LAZY_IMPORTS with its reason."""
    bad = [f"{m}:{line} imports {t} inside a function" for m, lst in graph().items()
           if not _within(m, "controller.cli")
           for t, line, top in lst if not top and t not in LAZY_IMPORTS.get(m, set())]
    assert bad == []


def test_the_module_map_in_the_docs_names_every_module():
    """docs/internals.md is the map of where things live: every module has its row."""
    doc = (ROOT / "docs" / "internals.md").read_text()
    missing = [str(p.relative_to(ROOT)) for m, p in modules().items()
               if p.name != "__main__.py" and m not in ("controller", "layers")
               and f"`{p.relative_to(ROOT)}`" not in doc]
    assert missing == []


# -- the tests' own layout -------------------------------------------------------------------

# Test folders that are not a room of the code: a test method or a task family across rooms.
TEST_FOLDERS_OUTSIDE_ROOMS = {
    "sim": "the deterministic simulation of broker and agent cores",
    "fuzz": "coverage-guided fuzzing of the parsers and checkers",
    "conversational": "the conversational task family end to end",
    "web": "the web task family end to end",
    "data": "public test material (no tests)",
    "golden": "golden files (no tests)",
}
# Module files at the top of tests/: the shared helpers, and the house-wide layering test.
TEST_TOP_FILES = {"__init__.py", "conftest.py", "farmprocs.py", "slurm_fixture.py", "test_layering.py"}


def _rooms() -> set[str]:
    """The rooms of the code: each sub-package of controller/ and nodeagent/, and the
    top-level packages layers/ and slurm/."""
    rooms = {"layers", "slurm"}
    for top in ("controller", "nodeagent"):
        rooms |= {p.name for p in (ROOT / top).iterdir() if (p / "__init__.py").exists()}
    return rooms


def test_tests_live_in_folders_named_after_the_rooms_they_test():
    tests_dir = ROOT / "tests"
    flat = sorted(p.name for p in tests_dir.glob("*.py") if p.name not in TEST_TOP_FILES)
    strange = sorted(p.name for p in tests_dir.iterdir()
                     if p.is_dir() and not p.name.startswith((".", "__"))
                     and p.name not in _rooms() and p.name not in TEST_FOLDERS_OUTSIDE_ROOMS)
    assert (flat, strange) == ([], [])


def test_the_shared_test_helpers_are_defined_once():
    """`wait_for` (a condition with a deadline) and `FakeClock` live in tests/conftest.py;
    a test module imports them instead of keeping a copy."""
    copies = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == ROOT / "tests" / "conftest.py" or "data" in path.relative_to(ROOT / "tests").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in ("wait_for", "FakeClock"):
                copies.append(f"{path.relative_to(ROOT)}:{node.lineno} defines {node.name}")
    assert copies == []
