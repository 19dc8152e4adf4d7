"""The shared on-disk formats: what every part of Paddock writes and reads the same way on
(shared) storage. `fileio` (the atomic write, file hashes, the records' wall-clock time), `keys`
(the run's CURVE key file and the private run directory), `taskblobs` (task content by digest,
the lease reference, the run's tasks file).

A leaf beside the vocabulary (`controller.contracts`): files only (no sockets, no database, no
processes), and of Paddock it imports only the vocabulary. The node agent, `layers` and `slurm`
may import it, as they import the vocabulary (docs/internals.md, "The top-level layout").
Must not import: zmq, sqlite3, subprocess, socket, controller.* other than controller.contracts
and controller.ondisk, nodeagent, layers, slurm.
"""
