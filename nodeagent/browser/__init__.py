"""Web tasks on the node: the task's web app and a headless chromium inside the rollout's sandbox,
driven over the Chrome DevTools Protocol through the sandbox's relay socket (`session`, `cdp`,
`bridge`, `rollout`; the apps in `apps`). Must not import: zmq, nodeagent.agent.daemon.
"""
