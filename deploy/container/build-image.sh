#!/usr/bin/env bash
# Builds the tokentap agent image from scratch, without pulling anything:
# the agent binary (eBPF object embedded), the glibc pieces it and NVML need,
# CA certificates, and an empty, writable-by-mount layout.
#
# Owns: the image's file layout and its config (entrypoint, labels, user).
# Must not: pull from a registry, or copy anything of the host beyond the
# listed files.
#
# Usage: build-image.sh [--binary PATH] [--tag NAME:TAG] [--method buildah|oci]
#                       [--archive FILE]
#   --method buildah (default): buildah from scratch → copy → config → commit
#            into containers-storage (podman sees it at once).
#   --method oci: writes an OCI image layout itself (one tar layer, config,
#            manifest, index; sha256 digests, python3 only) and loads it with
#            `podman load`.
#   --archive FILE: also write the image as an oci-archive to FILE.
set -euo pipefail

binary=/tmp/tokentap-release
tag=localhost/tokentap:dev
method=buildah
archive=
while (($#)); do
    case $1 in
        --binary) binary=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --method) method=$2; shift 2 ;;
        --archive) archive=$2; shift 2 ;;
        *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)

if [[ ! -x $binary ]]; then
    echo "build-image.sh: no agent binary at $binary (build it: cargo xtask build --dist)" >&2
    exit 1
fi
# The eBPF object is compiled into the binary; refuse one without it.
if ! grep -qa "sys_exit_read" "$binary"; then
    echo "build-image.sh: $binary has no embedded eBPF object (build it with cargo xtask build)" >&2
    exit 1
fi
version=$("$binary" --version | awk '{print $2}')
# Source and licence labels come from the workspace manifest, not from here.
manifest=$here/../../Cargo.toml
source_url=$(sed -n 's/^repository = "\(.*\)"/\1/p' "$manifest")
license=$(sed -n 's/^license = "\(.*\)"/\1/p' "$manifest")
start_ns=$(date +%s%N)

# --- the root filesystem -------------------------------------------------
tmp=$(mktemp -d /tmp/tokentap-image.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
rootfs=$tmp/rootfs
multiarch=x86_64-linux-gnu
mkdir -p "$rootfs" "$rootfs"/{usr/lib/$multiarch,usr/lib64,etc/ssl/certs,tmp,var/lib/tokentap,var/tmp,run,proc,sys,dev}
# Debian's merged /usr: /lib and /lib64 are links into /usr, so the loader
# path baked into the binary (/lib64/ld-linux-x86-64.so.2) resolves, and the
# NVIDIA container toolkit finds the usual directories to put NVML in.
ln -s usr/lib "$rootfs/lib"
ln -s usr/lib64 "$rootfs/lib64"
ln -s ../lib/$multiarch/ld-linux-x86-64.so.2 "$rootfs/usr/lib64/ld-linux-x86-64.so.2"

# What the binary links (ldd), plus the glibc compatibility stubs that
# libnvidia-ml.so.1 still names (libpthread, libdl, librt): NVML is dlopen'ed
# from the driver mounted in at run time, and its NEEDED entries must load.
libs=$(ldd "$binary" | awk '/=> \//{print $3} /^[[:space:]]*\/.*ld-linux/{print $1}')
for l in $libs /lib/$multiarch/libpthread.so.0 /lib/$multiarch/libdl.so.2 /lib/$multiarch/librt.so.1; do
    cp -L "$l" "$rootfs/usr/lib/$multiarch/$(basename "$l")"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
# Debug info is not needed at run time (the embedded eBPF object, with its
# BTF, is data and stays); symbols stay for readable panics.
strip --strip-debug -o "$rootfs/tokentap" "$binary"
chmod 0755 "$rootfs/tokentap"
printf 'root:x:0:0:root:/:/tokentap\nnobody:x:65534:65534:nobody:/:/tokentap\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$rootfs/etc/group"
chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"
chmod 0700 "$rootfs/var/lib/tokentap"
# The layout must run by itself: loader, libraries and binary found.
if ! chroot "$rootfs" /tokentap --version >/dev/null; then
    echo "build-image.sh: the agent does not start in the image's root filesystem (missing loader or library?)" >&2
    exit 1
fi

labels=(
    "org.opencontainers.image.title=tokentap"
    "org.opencontainers.image.description=eBPF node agent measuring LLM inference servers (TTFT, TPOT, tokens)"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.source=$source_url"
    "org.opencontainers.image.licenses=$license"
)

case $method in
buildah)
    ctr=$(buildah from --pull=never scratch)
    buildah copy --quiet "$ctr" "$rootfs" / >/dev/null
    config=(--entrypoint '["/tokentap"]' --cmd '["run","--no-console"]' --workingdir / --user 0:0
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --os linux --arch amd64)
    for l in "${labels[@]}"; do config+=(--label "$l"); done
    buildah config "${config[@]}" "$ctr"
    # --timestamp 0: the same inputs give the same image digest.
    buildah commit --quiet --timestamp 0 --rm "$ctr" "$tag" >/dev/null
    if [[ -n $archive ]]; then
        rm -f "$archive"
        buildah push --quiet "$tag" "oci-archive:$archive:$tag"
    fi
    ;;
oci)
    layout=$tmp/layout
    args=(--rootfs "$rootfs" --out "$layout" --ref "$tag" --entrypoint=/tokentap
        --cmd=run --cmd=--no-console --env=SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)
    for l in "${labels[@]}"; do args+=("--label=$l"); done
    python3 "$here/oci_layout.py" "${args[@]}"
    out=${archive:-$tmp/image.oci.tar}
    tar -C "$layout" -cf "$out" oci-layout index.json blobs
    # podman names the image after the index's ref.name annotation.
    podman load --quiet -i "$out" >/dev/null
    ;;
*)
    echo "build-image.sh: --method is buildah or oci" >&2
    exit 2
    ;;
esac

end_ns=$(date +%s%N)
size_bytes=$(podman image inspect --format '{{.Size}}' "$tag")
echo "built $tag ($method) in $(((end_ns - start_ns) / 1000000)) ms; size $size_bytes bytes"
