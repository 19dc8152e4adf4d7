"""The task bank: task packages and manifests on disk, importers of public formats, the
built-in task set, the curriculum and its band classes, and the contamination check. (Task
validation grades solutions, so it is node-side work: `nodeagent.verifier.validate`.)

May import: controller.contracts. Must not import: zmq, nodeagent, controller.broker, controller.cli.
"""
