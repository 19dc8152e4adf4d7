"""The node's model gateway: every model call of a rollout passes it, from the built-in harness
(in process, `Session` is its `Model`) or from a harness inside the sandbox (over HTTP on a Unix
socket the sandbox reaches as http://127.0.0.1:3128/v1, through its relay).

    wire.py     pure: the token-level request flags (vLLM, SGLang), reading ids/logprobs back,
                the parent call and prompt-extension flag, SSE for streaming clients
    session.py  one rollout: budgets (calls, tokens, wall time), forwarding to the current
                policy version's endpoint, retry across a weight update, the model_calls rows
    server.py   the OpenAI-compatible HTTP front of a Session on a Unix socket (or TCP)

May import: controller.contracts, nodeagent.harness.model (the HTTP client). Must not import:
zmq, nodeagent.agent, nodeagent.verifier, nodeagent.harness.loop.
"""
