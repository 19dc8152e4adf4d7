"""The sandbox runtime: the node namespace holder, per-sandbox builder and init (native C), caps
(cgroups, rlimits, seccomp), warm pool, and the Apptainer backend behind the same interface.

    spec.py       the data types: SandboxSpec, ExecResult, Change, SandboxError; the diff as a tar
    interface.py  the named interface: SandboxBackend, SandboxHandle (both backends subclass them)
    runtime.py    the native backend, SandboxRuntime (re-exports the names the rest imports)
    handle.py     one native sandbox, Sandbox
    host.py       host checks and detection (subids, kernel overlay path, FUSE), the state-dir sweep
    statedir.py   the per-user run root ($XDG_RUNTIME_DIR/paddock or /tmp/paddock-<uid>) and its checks
    usercaps.py   caps without cgroups: the memory monitor, CPU slices + SCHED_BATCH, pids per id slice
    warmpool.py   ready sandboxes per spec; PooledBackend gives a backend pool/acquire
    zygote.py     the node namespace holder (internal entry point `python -m nodeagent.sandbox.zygote`)
    layerfs.py    the node's copies of layers (unpacked once onto the layer tmpfs, whiteouts for the overlay)
    setuplayer.py set-up once: a task's setup commands run in one sandbox, their diff kept as a layer
    sbxinit.py    requests to the native builder and init, file operations in a sandbox's namespace
    cgroups.py, seccomp.py, nsutil.py, framing.py, native/   caps, syscall filter, syscalls, wire, C
    apptainer.py  the Apptainer backend

May import: controller.contracts (of the controller, only it), layers. Must not import: zmq,
nodeagent.agent, nodeagent.harness, nodeagent.verifier.
"""
