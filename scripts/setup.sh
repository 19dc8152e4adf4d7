#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for Paddock (run as root):
#   Debian packages (Slurm, sandbox tools, image build), the unprivileged sandbox user with a
#   subordinate uid/gid range, /dev/fuse usable by that user, and the project's virtualenv;
#   then what an ordinary (non-root) user needs to run the farm, as a cluster admin would
#   provide it: test users with their own subordinate ranges and a world-readable interpreter
#   with Paddock installed (see "Ordinary users" below and docs/security.md).
# Re-running changes nothing that is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
SBX_USER=${PADDOCK_SANDBOX_USER:-paddock}
VENV=${PADDOCK_VENV:-.venv}
PY=${PYTHON:-python3}
TEST_USERS=${PADDOCK_TEST_USERS:-paddock-u1 paddock-u2}   # ordinary users the multi-user tests run as
SHARED_VENV=${PADDOCK_SHARED_VENV:-/opt/paddock/venv}      # built from Debian's python3: any user can run it

need_pkgs=(slurmctld slurmd slurm-client munge
           slurmdbd mariadb-server   # job accounting of the in-test cluster (sacct; submitit sees dead jobs)
           squashfs-tools squashfuse fuse-overlayfs fuse3 uidmap iproute2 nftables
           debootstrap busybox-static ca-certificates python3-venv
           zstd   # zstd: .tar.zst image sources and zstd OCI layers (layers/staging.py)
           libseccomp2   # the sandbox's seccomp filter is built with libseccomp (nodeagent/sandbox/seccomp.py)
           gcc libc6-dev   # the native sandbox init (nodeagent/sandbox/native/sbxinit.c), built below and on first use
           libfuse3-dev    # headers of the squashfuse_ll preload (nodeagent/sandbox/native/fuseshim.c)
           bubblewrap    # bubblewrap: the reference point of benchmarks/sandbox_start.py
           tinyproxy-bin   # the reference point of benchmarks/egress_proxy.py
           chromium tmux)   # the report is checked as a person sees it (headless Chromium), `paddock top` in a real terminal
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: run as root (it installs Debian packages and creates the sandbox user)" >&2
  exit 1
fi
missing=()
for p in "${need_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The sandbox user and its subordinate id range (sandboxes map into it, never to a real uid).
id "$SBX_USER" >/dev/null 2>&1 || useradd --system --create-home --shell /usr/sbin/nologin "$SBX_USER"
grep -q "^$SBX_USER:" /etc/subuid || usermod --add-subuids 100000-165535 "$SBX_USER"
grep -q "^$SBX_USER:" /etc/subgid || usermod --add-subgids 100000-165535 "$SBX_USER"
# No udev here: /dev/fuse is 0600 until set; unprivileged (namespaced) FUSE mounts need it.
[ -c /dev/fuse ] || { echo "setup: /dev/fuse is missing (load the fuse module)" >&2; exit 1; }
chmod 0666 /dev/fuse
# The image store must be traversable by the sandbox's subordinate uids.
mkdir -p /var/tmp/paddock/images && chmod 0755 /var/tmp/paddock /var/tmp/paddock/images

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# Reinstall whenever pyproject.toml changed since the last install (a stamp of its hash), so a
# dependency added later reaches machines that were set up before.
stamp="$VENV/.paddock-deps"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -c 'import controller, nodeagent, layers' 2>/dev/null; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e '.[test,semantic]'   # semantic: the contamination check's embedding stage is tested too
  echo "$want" > "$stamp"
fi
# A cgroup v1 migration (each sandbox init joins its cgroups) waits for an RCU grace period
# (5-15 ms here) unless the cgroup core favours dynamic changes; the flag is global, set through
# any cgroup2 mount. Cost: forks and exits take a slightly slower lock path.
if grep -q " cgroup2 " /proc/mounts && ! grep " cgroup2 " /proc/mounts | grep -q favordynmods; then
  mnt="$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)"
  mount -o remount,favordynmods "$mnt" || echo "setup: cannot set favordynmods on $mnt: sandbox creates wait for RCU" >&2
fi
# Build the native sandbox init now (the runtime would on first use).
"$VENV/bin/python" -c 'from nodeagent.sandbox import native; print("setup: sandbox init", native.init_binary())'
"$VENV/bin/python" -c 'from nodeagent.sandbox import native; print("setup: squashfuse preload", native.fuse_shim())'

# ---- Ordinary users (what a cluster admin provides; docs/security.md) -----------------------
# Each user gets a home and, from useradd (SUB_UID_MIN.. in /etc/login.defs), its own disjoint
# subordinate uid/gid range: its sandboxes map there (newuidmap/newgidmap, from uidmap).
for u in $TEST_USERS; do
  id "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$u"
  for f in /etc/subuid /etc/subgid; do
    if ! grep -q "^$u:" "$f"; then   # a user made before (or without) automatic ranges
      next="$(awk -F: 'BEGIN {m = 100000} {if ($2 + $3 > m) m = $2 + $3} END {print m}' "$f")"
      if [ "$f" = /etc/subuid ]; then usermod --add-subuids "$next-$((next + 65535))" "$u"
      else usermod --add-subgids "$next-$((next + 65535))" "$u"; fi
    fi
  done
done
# The project's .venv runs a Python under /root, which other users cannot execute: a second
# venv from Debian's python3 at a world-readable path, with Paddock installed from a wheel built
# from this checkout (the checkout itself may live where other users cannot read).
if [ ! -x "$SHARED_VENV/bin/python" ]; then
  mkdir -p "$(dirname "$SHARED_VENV")"
  /usr/bin/python3 -m venv "$SHARED_VENV"
fi
src_hash="$(find pyproject.toml controller nodeagent layers slurm -type f \( -name '*.py' -o -name '*.c' \
            -o -name '*.yaml' -o -name '*.json' -o -name '*.toml' \) -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$SHARED_VENV/.paddock-src" 2>/dev/null)" != "$src_hash" ] \
   || ! "$SHARED_VENV/bin/python" -c 'import controller, nodeagent, layers' 2>/dev/null; then
  wheels="$(mktemp -d)"   # built from a copy: no build/ or egg-info left in the checkout
  cp -r pyproject.toml controller nodeagent layers slurm "$wheels/"
  "$SHARED_VENV/bin/pip" wheel -q --no-deps -w "$wheels" "$wheels"
  whl="$(ls "$wheels"/paddock-*.whl)"
  "$SHARED_VENV/bin/pip" install -q --force-reinstall --no-deps "$whl"
  "$SHARED_VENV/bin/pip" install -q "$whl[test]"   # and its dependencies
  rm -rf "$wheels"
  echo "$src_hash" > "$SHARED_VENV/.paddock-src"
fi
chmod -R a+rX "$(dirname "$SHARED_VENV")"
# Slurm as a real cluster runs it: slurmctld/slurmdbd as the `slurm` user (Debian's packages
# make it; made here if they did not), jobs as their submitter. The in-test cluster's jobs are
# submitted by the first test user with its own sbatch (runuser, util-linux).
id slurm >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin slurm
command -v runuser >/dev/null || { echo "setup: runuser (util-linux) is missing" >&2; exit 1; }
# Their jobs read the shared image store (0755/0644; the built-in image is built there by root,
# e.g. by the first `make test`) and run this interpreter; each user's task validations are
# cached in its ~/.cache, not in the store.
for u in $TEST_USERS; do   # each user's own build of the native init (in its ~/.cache)
  runuser -u "$u" -- "$SHARED_VENV/bin/python" -c 'from nodeagent.sandbox import native; native.init_binary(); native.fuse_shim()' \
    || echo "setup: cannot build the native sandbox init as $u" >&2
done
echo "setup: ordinary users: $(for u in $TEST_USERS; do printf '%s ' "$(grep "^$u:" /etc/subuid)"; done)(interpreter: $SHARED_VENV/bin/python)"
echo "setup: ok (sandbox user $SBX_USER: $(grep "^$SBX_USER:" /etc/subuid))"
