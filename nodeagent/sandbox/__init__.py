"""The sandbox runtime: the node namespace holder, per-sandbox builder and init (native C), caps
(cgroups, rlimits, seccomp), warm pool, and the Apptainer backend behind the same interface.

Must not import: zmq, controller.*, nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
