"""The repository-mode attack battery as a measurement: grade every attack of
tests/verifier/test_repo_attacks.py and the honest references, print outcome, reward and
`tampered` per attack and the count rewarded. Not collected by default (no `test_` prefix): run
`python -m pytest -q -s -p no:cacheprovider tests/verifier/repo_battery.py` (against another
checkout: copy this file and test_repo_attacks.py into its tests/verifier/)."""
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import tests.verifier.test_repo_attacks as A


def main(runtime, image):
    so = Path(tempfile.mkdtemp()) / "_speedups.so"
    so.with_suffix(".c").write_text(A.NATIVE_C)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(so.with_suffix(".c")), "-o", str(so)], check=True)
    pt = A.repo_task(A.PYTEST_TESTS, {"calc.py": A.WRONG})
    pt_conf = A.repo_task(A.PYTEST_TESTS, {"calc.py": A.WRONG}, conftest="import calc  # noqa: F401\n")
    ut = A.repo_task(A.UNITTEST_TESTS, {"calc.py": A.WRONG}, f2p=("tests/test_calc.py::TestCalc::test_add_negative",),
                     p2p=("tests/test_calc.py::TestCalc::test_add",))
    ht = A.repo_task(A.HELPER_TESTS, {"calc/__init__.py": A.WRONG, "calc/testing.py": A.TESTING})
    cases = [("1 closure switch + emitter", pt, {"calc.py": A.CLOSURE_SWITCH}),
             ("1b thread trampoline + emitter", pt, {"calc.py": A.THREAD_TRAMPOLINE}),
             ("2 native oracle", pt, {"calc.py": A.NATIVE_ORACLE, "_speedups.so": so.read_bytes()}),
             ("3 conftest-time report patch", pt_conf, {"calc.py": A.REPORT_PATCH}),
             ("4 meta_path list subclass", pt_conf, {"calc.py": A.META_PATH}),
             ("4b finder sources oracle", A.repo_task(A.TWO_MODULES, {"calc.py": A.WRONG}, p2p=("tests/test_a.py::test_one",)),
              {"calc.py": A.FINDER_ORACLE})]
    cases += [(f"5 {n}", pt, {"calc.py": s}) for n, s in sorted(A.EQ_BYPASSES.items())]
    cases += [("6 unittest always_equal", ut, {"calc.py": A.ALWAYS_EQUAL}),
              ("6 unittest first_call_only", ut, {"calc.py": A.EQ_BYPASSES["true_on_first_call_only"]}),
              ("6 unittest assertEqual patched", ut, {"calc.py": A.ASSERT_EQUAL_PATCH}),
              ("7 no-op pkg/testing.py helper", ht, {"calc/testing.py": "def assert_close(actual, expected, tol=1e-9):\n    pass\n"}),
              ("sib honest_eq swapped in test module", pt, {"calc.py": A.HONEST_EQ_SWAPPED}),
              ("sib TestCase.run patched", ut, {"calc.py": A.TESTCASE_RUN})]
    refs = [("ref pytest gold", pt, {"calc.py": A.GOLD}), ("ref conftest gold", pt_conf, {"calc.py": A.GOLD}),
            ("ref unittest gold", ut, {"calc.py": A.GOLD}), ("ref helper gold", ht, {"calc/__init__.py": A.GOLD})]
    rewarded = 0
    for name, task, files in cases + refs:
        try:
            v = A.grade(runtime, image, task, files)
            out = f"{v.outcome} reward={v.reward} tampered={v.tampered} | {v.checks[-1]['detail'][:110]}"
            if not name.startswith("ref") and v.reward > 0:
                rewarded += 1
        except Exception as exc:
            out = f"EXC {type(exc).__name__}: {str(exc)[:120]}"
        print(f"{name:40s} {out}")
    print(f"attacks rewarded: {rewarded}/{len(cases)}")

def test_battery(runtime, python_image):
    main(runtime, python_image)
