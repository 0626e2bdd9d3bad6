#!/usr/bin/env python3
"""Writes an OCI image layout (image-spec v1.1) for one root filesystem:
one gzip'ed tar layer, the image config, the manifest and index.json, each
blob named by its sha256 digest. Standard library only.

Owns: the layout's bytes (reproducible: sorted entries, mtime 0, uid/gid 0,
gzip without a timestamp). Must not: read anything but the given rootfs.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile


def layer_tar(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for dirpath, dirnames, filenames in os.walk(rootfs):
            for name in dirnames + filenames:
                paths.append(os.path.join(dirpath, name))
        for path in sorted(paths):
            arc = os.path.relpath(path, rootfs)
            info = tar.gettarinfo(path, arcname=arc)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def put_blob(out: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    os.makedirs(os.path.join(out, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(out, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rootfs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ref", required=True, help="image name, e.g. localhost/tokentap:dev")
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--label", action="append", default=[])
    a = p.parse_args()

    tar_bytes = layer_tar(a.rootfs)
    diff_id = "sha256:" + hashlib.sha256(tar_bytes).hexdigest()
    gz = gzip.compress(tar_bytes, compresslevel=9, mtime=0)
    layer_digest = put_blob(a.out, gz)

    labels = dict(l.split("=", 1) for l in a.label)
    config = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": a.entrypoint,
            "Cmd": a.cmd,
            "Env": a.env,
            "WorkingDir": "/",
            "User": "0:0",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "deploy/container/oci_layout.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = put_blob(a.out, config_bytes)

    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": layer_digest,
            "size": len(gz),
        }],
        "annotations": labels,
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = put_blob(a.out, manifest_bytes)

    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "annotations": {"org.opencontainers.image.ref.name": a.ref},
        }],
    }
    with open(os.path.join(a.out, "index.json"), "w") as f:
        json.dump(index, f, sort_keys=True, separators=(",", ":"))
    with open(os.path.join(a.out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    print(f"{a.ref} {manifest_digest} layer {len(gz)} bytes (uncompressed {len(tar_bytes)})")


if __name__ == "__main__":
    main()
