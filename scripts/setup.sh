#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for Paddock (run as root):
#   Debian packages (Slurm, sandbox tools, image build), the unprivileged sandbox user with a
#   subordinate uid/gid range, /dev/fuse usable by that user, and the project's virtualenv.
# Re-running changes nothing that is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
SBX_USER=${PADDOCK_SANDBOX_USER:-paddock}
VENV=${PADDOCK_VENV:-.venv}
PY=${PYTHON:-python3}

need_pkgs=(slurmctld slurmd slurm-client munge
           slurmdbd mariadb-server   # job accounting of the in-test cluster (sacct; submitit sees dead jobs)
           squashfs-tools squashfuse fuse-overlayfs fuse3 uidmap iproute2 nftables
           debootstrap busybox-static ca-certificates python3-venv
           zstd   # zstd: .tar.zst image sources and zstd OCI layers (layers/staging.py)
           libseccomp2   # the sandbox's seccomp filter is built with libseccomp (nodeagent/sandbox/seccomp.py)
           gcc libc6-dev   # the native sandbox init (nodeagent/sandbox/native/sbxinit.c), built below and on first use
           libfuse3-dev    # headers of the squashfuse_ll preload (nodeagent/sandbox/native/fuseshim.c)
           bubblewrap    # bubblewrap: the reference point of benchmarks/sandbox_start.py
           tinyproxy-bin)   # the reference point of benchmarks/egress_proxy.py
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
  "$VENV/bin/pip" install -q -e '.[test]'
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
"$VENV/bin/python" -c 'from nodeagent import native; print("setup: sandbox init", native.init_binary())'
"$VENV/bin/python" -c 'from nodeagent import native; print("setup: squashfuse preload", native.fuse_shim())'
echo "setup: ok (sandbox user $SBX_USER: $(grep "^$SBX_USER:" /etc/subuid))"
