#!/usr/bin/env bash
# Installs what the container image build and the container test need on a
# Debian 12 (bookworm) host, as root: podman and buildah (Debian packages),
# runc as the OCI runtime, and a containers configuration that never pulls
# from a registry.
#
# Owns: the host packages and /etc/containers/{containers.conf,registries.conf,
# policy.json,storage.conf} (written only when absent, so an admin's files are
# kept). Must not: pull images, touch a running engine, or enable services.
#
# Idempotent: a second run installs nothing and rewrites nothing.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    echo "install-tools.sh: run as root (apt-get and /etc/containers)" >&2
    exit 1
fi

start_s=$(date +%s)
# uidmap: newuidmap/newgidmap (podman refuses to start without them for
#   rootless use and warns as root).
# netavark + iptables: the network stack for the container's own network
#   namespace (podman's default bridge); aardvark-dns is not needed.
# crun is pulled in by podman's Depends but refuses a hybrid cgroup v1/v2
#   layout; runc works everywhere, so containers.conf selects it.
# fuse-overlayfs is not needed as root: the kernel's overlay driver is used
#   (storage.conf below); vfs is the fallback where overlay cannot mount.
pkgs=(podman buildah runc uidmap netavark iptables)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y --no-install-recommends "${missing[@]}"
fi

mkdir -p /etc/containers

# Nothing is ever pulled: no unqualified-search registries and a short-name
# mode that refuses instead of asking.
if [[ ! -e /etc/containers/registries.conf ]]; then
    cat > /etc/containers/registries.conf <<'CONF'
# tokentap hosts: images are built locally from scratch; nothing is pulled.
unqualified-search-registries = []
short-name-mode = "enforcing"
CONF
fi

# The signature policy podman/buildah require before they load any image.
# Only local transports are used (containers-storage, oci-archive, oci,
# docker-archive); a pull from a registry is rejected.
if [[ ! -e /etc/containers/policy.json ]]; then
    cat > /etc/containers/policy.json <<'CONF'
{
    "default": [{"type": "reject"}],
    "transports": {
        "containers-storage": {"": [{"type": "insecureAcceptAnything"}]},
        "oci-archive": {"": [{"type": "insecureAcceptAnything"}]},
        "oci": {"": [{"type": "insecureAcceptAnything"}]},
        "docker-archive": {"": [{"type": "insecureAcceptAnything"}]},
        "dir": {"": [{"type": "insecureAcceptAnything"}]}
    }
}
CONF
fi

# runc as the runtime; cgroupfs because a host without a systemd PID 1 (and
# hybrid cgroup v1 hosts) cannot use the systemd cgroup manager; explicit
# ulimits because podman's defaults copy the host's, which runc may refuse.
if [[ ! -e /etc/containers/containers.conf ]]; then
    cat > /etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
fi

# overlay when the kernel can mount it (checked by podman on first use),
# else vfs (a full copy per layer; fine for a ≤ 30 MB image).
if [[ ! -e /etc/containers/storage.conf ]]; then
    driver=vfs
    if grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null; then
        driver=overlay
    fi
    cat > /etc/containers/storage.conf <<CONF
[storage]
driver = "$driver"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
CONF
fi

end_s=$(date +%s)
echo "install-tools.sh: done in $((end_s - start_s)) s"
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='  ${Package} ${Version}\n' "$p"
done
echo "  storage driver: $(sed -n 's/^driver = "\(.*\)"/\1/p' /etc/containers/storage.conf)"
