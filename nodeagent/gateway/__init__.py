"""The node's model gateway: every model call of a rollout passes it, from the built-in harness
(in process, `Session` is its `Model`) or from a harness inside the sandbox (over HTTP on a Unix
socket the sandbox reaches as http://127.0.0.1:3128/v1, through its relay).

    wire.py     pure: the token-level request flags (vLLM, SGLang), reading ids/logprobs back
                (from a reply or a stream's chunks), the parent call and prompt-extension flag
    session.py  one rollout: budgets (calls, tokens, wall time), forwarding (streamed or not)
                to the current policy version's endpoint, retry across a weight update under
                the node's newest policy (`Follow`), the model_calls rows
    upstream.py the kept connection to a model server (whole replies and SSE streams)
    http1.py    HTTP/1.1 framing for both sides (heads, bodies, chunks, server-sent events)
    server.py   the OpenAI-compatible HTTP front of a Session on a Unix socket (or TCP)

May import: controller.contracts, nodeagent.harness.model (the HTTP client). Must not import:
zmq, nodeagent.agent, nodeagent.verifier, nodeagent.harness.loop.
"""
