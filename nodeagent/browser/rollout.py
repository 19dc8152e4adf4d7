"""A web task's agent phase: sandbox + app + browser, the browser tools, the captured state.

`run_web_agent` is what `nodeagent.agent.attempt` runs for a task of family `web` in place of
the shell-tool harness: it makes the rollout's `BrowserSession` (its socket becomes the
sandbox's relay socket, so the sandbox has no network but loopback), acquires the sandbox,
starts the app and chromium in it, runs the built-in agent loop with a `BrowserToolbox`, and
captures the app's state for the verifier (`nodeagent.verifier.webstate.state_changes`).
Screenshots are written to `<run_dir>/artifacts/<rollout>.<attempt>/` (atomically) and the
observation names that path, relative to the run directory. The `sandbox_start` span covers
the sandbox, the app and chromium (named so).

Returns `(AgentResult, infra reason or None, changes)` like the attempt's own agent phase (`nodeagent.agent.agentphase`):
a sandbox or browser that fails to start, or a browser that dies mid-rollout, is an infra
reason (retried), never a score.
Must not import: zmq, nodeagent.agent.daemon.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from controller.contracts.browser_tools import BrowserBudgets
from controller.contracts.tools import ToolSetError
from controller.ondisk.fileio import atomic_write
from nodeagent.browser.session import BrowserSession, BrowserStartError
from nodeagent.harness.browser_tools import BrowserToolbox
from nodeagent.harness.loop import AgentResult, run_agent
from nodeagent.harness.model import ModelError
from nodeagent.sandbox.runtime import SandboxError, SandboxSpec
from nodeagent.verifier.webstate import as_bytes, state_changes

log = logging.getLogger(__name__)


def artifact_sink(run_dir: str, rollout_id: str, attempt: int) -> Callable[[str, bytes], str]:
    rel = Path("artifacts") / f"{rollout_id}.{attempt}"

    def sink(name: str, data: bytes) -> str:
        (Path(run_dir) / rel).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(run_dir) / rel / name, data)
        return str(rel / name)
    return sink


def _span(kind: str, name: str, t0: float, start: float, end: float) -> dict:
    return {"kind": kind, "name": name, "step": 0, "start_s": start - t0, "duration_s": max(end - start, 0.0)}


def run_web_agent(runtime, image: Path, a, task, clock: Callable[[], float], t0: float, session,
                  layers: tuple = ()) -> tuple[AgentResult, str | None, list]:
    agent, infra, changes = AgentResult(), None, []
    bs = BrowserSession(clock=clock)
    try:
        sb = runtime.acquire(SandboxSpec(image=image, limits=dict(task.limits),
                                        files={k: as_bytes(v) for k, v in task.files.items()},
                                        egress_socket=bs.path, layers=layers))
    except (SandboxError, OSError) as exc:
        bs.close()
        return agent, f"sandbox_start: {exc}", []
    spans = []
    try:
        bs.start(sb, as_bytes(task.hidden.get("seed.sql", b"")).decode())
        spans.append(_span("sandbox_start", "agent sandbox + app + chromium", t0, t0, clock()))
        toolbox = BrowserToolbox(bs, task.tools or None, observation_bytes=task.budgets.observation_bytes,
                                 budgets=BrowserBudgets(), artifacts=artifact_sink(a.run_dir, a.rollout_id, a.attempt))
        agent = run_agent(sb, task.instruction, session, a.model, a.seed, task.budgets, clock,
                          span_origin=t0, toolbox=toolbox)
        changes = state_changes(bs.capture(sb))
    except BrowserStartError as exc:
        infra = f"browser_start: {exc}"
        spans.append(_span("sandbox_start", "agent sandbox + app + chromium", t0, t0, clock()))
    except ModelError as exc:
        infra = f"model_server: {exc}"
        agent = exc.result or agent
    except ToolSetError as exc:
        infra = f"task: {exc}"
    except SandboxError as exc:
        infra = f"sandbox: {exc}"
    finally:
        sb.destroy()
        bs.close()
    agent.spans[:0] = spans
    return agent, infra, changes


__all__ = ["artifact_sink", "run_web_agent"]
