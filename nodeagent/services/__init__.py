"""Mock services for tool-use tasks: the rule engine (`engine`, runs inside the rollout's
sandbox) and the per-rollout host (`host`). Must not import zmq, nodeagent.agent or
nodeagent.verifier."""
