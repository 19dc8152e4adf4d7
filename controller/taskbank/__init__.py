"""The task bank: task packages and manifests on disk, importers of public formats, the
built-in task set, the curriculum, the contamination check and task validation.

May import: controller.contracts (validation also grades, through nodeagent.verifier and
nodeagent.sandbox). Must not import: zmq, controller.broker, controller.cli.
"""
