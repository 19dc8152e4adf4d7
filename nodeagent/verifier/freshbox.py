"""The grading sandbox: fresh, of the rollout's image and layers, holding the task's visible
files and then the agent's changes, source only.

`fresh_sandbox` is where the pytest and command checks (`nodeagent.verifier.pytestcheck`,
`nodeagent.verifier.commandcheck`) get their sandbox; `compiled_artifact` says which of the
agent's changes never enter one (bytecode, native modules, `.pth` files, package metadata);
`agent_files` is the agent's changes under /work by relative path; `home_startup` says which of
them are start-up files of the agent's HOME (/work in the agent's sandbox: the Python user site
under `.local`, shell and tool rc files), never applied either; `callee_uid` is the uid a
grading sandbox runs the agent's code under. The limits both checks share
(`CHECK_TIMEOUT_S`, `OUTPUT_CAP`) and where checker files go (`TESTS_DIR`) are here.

Must not import: zmq, controller.* outside contracts, nodeagent.agent, nodeagent.verifier.grade.
"""
from __future__ import annotations

from controller.contracts.tasks import GradedTask
from nodeagent.sandbox.runtime import Change, SandboxError, SandboxSpec
from nodeagent.verifier.verdicts import VerifierInfraError

CHECK_TIMEOUT_S = 60.0
OUTPUT_CAP = 16384
TESTS_DIR = "/verifier/tests"
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
METADATA_DIRS = (".dist-info", ".egg-info")
CALLEE_UID = 1001     # the agent's code in a grading sandbox (pytestcheck's call isolation uses the same)
# HOME is /work in the agent's sandbox: what interpreters and tools read from a HOME at start-up
HOME_DIRS = (".local", ".config", ".ipython", ".jupyter", ".npm", ".node_modules", ".cargo", ".gem")
HOME_FILES = frozenset({".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc",
                        ".zshenv", ".zprofile", ".kshrc", ".mkshrc", ".inputrc", ".pythonrc", ".pythonrc.py",
                        ".pythonstartup", ".npmrc", ".yarnrc", ".gitconfig", ".pydistutils.cfg", ".pip",
                        ".curlrc", ".wgetrc", ".netrc", ".perldb", ".irbrc", ".gemrc", ".Rprofile", ".noderc"})


def as_bytes(content: str | bytes) -> bytes:
    return content if isinstance(content, bytes) else content.encode()


def agent_files(changes: list[Change]) -> dict[str, bytes | None]:
    """The agent's changes under /work: relative path -> bytes (None if deleted)."""
    out: dict[str, bytes | None] = {}
    for c in changes:
        if c.path.startswith("/work/") and c.kind in ("added", "modified", "deleted"):
            out[c.path[len("/work/"):]] = c.data if c.kind != "deleted" else None
    return out


def compiled_artifact(path: str) -> bool:
    """What the agent's change may not bring into a grading sandbox: the grader applies source
    only. Python bytecode (`__pycache__/`, `*.pyc`: importlib trusts a cache file without its
    source, PEP 552's unchecked pycs, and its code objects can name any file); native extension
    modules (`*.so`, `*.pyd`, ...: C code walks frames and memory without any audit event);
    `.pth` files and package metadata (`*.dist-info/`, `*.egg-info/`, `.egg-link`: entry points
    that register pytest plugins, paths run at start-up)."""
    base = path.rstrip("/").rsplit("/", 1)[-1]
    return ("/__pycache__" in path or base.endswith((".pyc", ".pyo", ".pth", ".egg-link"))
            or base.endswith(NATIVE_SUFFIXES) or ".so." in base
            or any(part.endswith(METADATA_DIRS) for part in path.split("/")))


def home_startup(path: str) -> bool:
    """Is /work/`path` a start-up file of a HOME (the agent's sandbox has HOME=/work): its
    Python user site and config (`.local/`, `.config/`, ...) or an rc file (`.bashrc`,
    `.profile`, `.npmrc`, `.gitconfig`, ...) at the top of /work; or the repository's git config
    and hooks (`.git/config`'s `core.fsmonitor`, `core.hooksPath` run commands for any git in
    /work)? A grading sandbox never applies them (its commands get another HOME as well)."""
    rel = path[len("/work/"):] if path.startswith("/work/") else path.lstrip("/")
    top = rel.split("/", 1)[0]
    return (top in HOME_DIRS or ("/" not in rel.rstrip("/") and top in HOME_FILES)
            or rel.rstrip("/") == ".git/config" or rel.startswith(".git/hooks/"))


def callee_uid(runtime) -> int:
    """The uid a grading sandbox runs the agent's code under (inside the sandbox's id slice)."""
    top = int(getattr(runtime, "slice_size", CALLEE_UID + 1)) - 1
    return min(CALLEE_UID, top)


def fresh_sandbox(runtime, image, layers: tuple, task: GradedTask, changes: list[Change]):
    """A new sandbox of the same image and layers: the task's visible files, then the agent's
    changes (not its bytecode: `compiled_artifact`; nor its HOME's start-up files: `home_startup`). VerifierInfraError if it cannot be made."""
    try:
        sb = runtime.acquire(SandboxSpec(image=image, limits=dict(task.limits), files=dict(task.files),
                                        hostname="verifier", layers=layers))
    except SandboxError as exc:
        raise VerifierInfraError(f"verifier sandbox failed to start: {exc}") from None
    try:
        if changes:
            sb.apply([c for c in changes if (c.path == "/work" or c.path.startswith("/work/"))
                      and not ((compiled_artifact(c.path) or home_startup(c.path)) and c.kind != "deleted")])
    except SandboxError as exc:
        sb.destroy()
        raise VerifierInfraError(f"applying the agent's changes failed: {exc}") from None
    return sb


__all__ = ["CALLEE_UID", "CHECK_TIMEOUT_S", "callee_uid", "home_startup", "OUTPUT_CAP", "TESTS_DIR", "agent_files", "as_bytes", "compiled_artifact",
           "fresh_sandbox"]
