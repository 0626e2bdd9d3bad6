#!/usr/bin/env python3
"""Offline checks of tokentap's deployment material: `python3 deploy/check.py`.

Owns: rendering deploy/kubernetes (base and every overlay) and deploy/collector
with Kustomize, validating every rendered object against the Kubernetes API
schemas offline, asserting the agent's security invariants from the rendered
YAML, checking the collector config structurally and running Rotel (an OTLP
collector from PyPI) with the subset of it Rotel understands, and the
container spec the container test reads (--emit-container-spec).

Must not: touch a cluster, need root, or reach the network for anything but
the pinned tool install (pip, from PyPI). Its invariants read the documented
capability list from docs/deploy.md, so the DaemonSet and the docs cannot
drift apart silently.

Tools (pinned, installed on first run into target/deploy-tools, no other
setup needed):
  * Kustomize: the Kustomize Go API built as a shared library, shipped in the
    PyPI wheel `pykustomize` (loaded with ctypes; the wheel's own Python part
    is not used).
  * kubernetes-validate (PyPI) with its bundled schemas, --strict.
  * Rotel (PyPI wheel `rotel`, which carries the rotel-agent binary).

Options:
  --emit-container-spec FILE  write the base agent container's privileges as JSON
  --self-test                 break copies of the manifests on purpose and check
                              that every invariant catches its breakage
  --kubernetes-version V      schema version to validate against (default 1.30.0)
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):
    sys.exit("deploy/check.py needs Python 3.11 or newer (tomllib)")

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
TOOLS = REPO / "target" / "deploy-tools"
VENV = TOOLS / "venv"

# Pinned tools. Wheels carrying native code are fetched by pip for the
# platform named here (whatever Python runs this script) and hash-checked.
PIP_REQUIREMENTS = ["kubernetes-validate==1.37.0", "PyYAML==6.0.4"]
WHEELS = {
    "pykustomize": {
        "version": "0.1.4",
        "python": "3.14",
        "file": "pykustomize-0.1.4-py3-none-any.whl",
        "sha256": "f8da6be12fb35b56158d2f9043a67d39c1ce84eae9c8f344c7ed934709192467",
        "member": "pykustomize/_lib/linux-amd64/libpykustomize.so",
    },
    "rotel": {
        "version": "0.0.1a15",
        "python": "3.11",
        "file": "rotel-0.0.1a15-cp311-cp311-manylinux_2_34_x86_64.whl",
        "sha256": "2f4117e58410c933e0dc042a268ef738dab2e3a5d63b5831209acdac2a6ddcb7",
        "member": "rotel/rotel-agent",
    },
}

DEFAULT_K8S_VERSION = "1.30.0"

# What the rendered variants are. The key is the variant's name in messages
# and in the summary; the path is rendered with Kustomize.
AGENT_VARIANTS = {
    "default": DEPLOY / "kubernetes",
    "base": DEPLOY / "kubernetes" / "base",
    "privileged": DEPLOY / "kubernetes" / "overlays" / "privileged",
    "kube-metadata": DEPLOY / "kubernetes" / "overlays" / "kube-metadata",
    "seccomp-unconfined": DEPLOY / "kubernetes" / "overlays" / "seccomp-unconfined",
    "shared-salt": DEPLOY / "kubernetes" / "overlays" / "shared-salt",
    "tls": DEPLOY / "kubernetes" / "overlays" / "tls",
}
COLLECTOR = DEPLOY / "collector"

ALLOWED_HOST_PATHS = {"/sys/kernel/tracing", "/sys/fs/cgroup"}
LOCALHOST_PROFILE = "tokentap/agent.json"
SECCOMP_PROFILE_FILE = DEPLOY / "kubernetes" / "seccomp" / "agent.json"

# The Localhost profile's installer: the base's one init container, the
# only container with a writable host path (the kubelet's seccomp root), and
# exactly these privileges (uid 0 owns that directory; no capability).
KUBELET_SECCOMP_ROOT = "/var/lib/kubelet/seccomp"
SECCOMP_INIT = "seccomp-profile"
SECCOMP_INIT_SECURITY_CONTEXT = {
    "runAsUser": 0,
    "runAsGroup": 0,
    "runAsNonRoot": False,
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The variant without the Localhost profile and its installer: the agent
# Unconfined (the fallback overlay). overlays/privileged keeps the
# installer, unused (no filter applies to a privileged container).
UNCONFINED_VARIANTS = {"seccomp-unconfined"}

# Overlays whose one change is capabilities added to the base's: the
# rendered variant must equal the base except for exactly these, appended
# to the agent's capabilities.add, and docs/deploy.md's privileges table
# must mark each of them `overlays/<name>`. overlays/tls: uprobes need
# CAP_SYS_ADMIN on kernels with the CVE-2025-38466 fix (docs/deploy.md,
# "TLS (HTTPS engines)").
OVERLAY_ADDED_CAPS = {"tls": ["SYS_ADMIN"]}

# Syscalls the agent makes over its whole life, measured with `strace -f`
# on `tokentap run` (dist build of 2026-12-02, Linux 6.18, as the DaemonSet
# runs it: uid 0 with only CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE,
# CAP_DAC_READ_SEARCH, no_new_privs, the base's config.toml and
# --health-addr, probes polled): discovery of an HTTPS engine ("vllm" on
# its command line, in its own network namespace) with a client on it,
# the TLS attach (uprobes on its libssl through /proc/PID/root; run again
# with CAP_SYS_ADMIN added, which the kernel requires for uprobes, so the
# attach and the plaintext decode ran), the api_key_id key made in
# /var/lib/tokentap, OTLP export to a name that DNS cannot resolve (the
# base's) and to a local collector (Rotel) with the engine-metrics scrape,
# SIGTERM and SIGINT shutdown. Plus those the source calls on paths the
# runs did not reach (agent/src: openat2 in identity/model_version.rs,
# setrlimit for RLIMIT_MEMLOCK, sendmsg/recvmsg/readv/fstat/statfs).
AGENT_SYSCALLS = """
accept4 access arch_prctl bind bpf brk clock_nanosleep clone close connect
epoll_create1 epoll_ctl epoll_wait eventfd2 execve exit exit_group fcntl
fsync futex getdents64 getpeername getpid getrandom getsockname getsockopt
gettid ioctl linkat listen lseek madvise mkdir mmap mprotect mremap munmap
newfstatat openat perf_event_open pidfd_getfd pidfd_open poll prctl pread64
prlimit64 read readlink recvfrom rseq rt_sigaction rt_sigprocmask
rt_sigreturn sched_getaffinity sendmmsg sendto set_robust_list
set_tid_address setns setsockopt shutdown sigaltstack socket socketpair
statx uname unlink write writev
openat2 setrlimit sendmsg recvmsg readv fstat statfs
""".split()
# Calls the agent makes that the profile answers with an errno on purpose:
# glibc's pthread_create tries clone3 first and falls back to clone on
# ENOSYS (the default profiles do the same: clone3's flags sit in memory,
# out of a filter's reach).
AGENT_SYSCALLS_ERRNO = {"clone3": 38}

# Kernel headers that name every syscall (linux-libc-dev): the profile's
# names must be real ones.
SYSCALL_HEADERS = [
    "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
    "/usr/include/x86_64-linux-gnu/asm/unistd_32.h",
    "/usr/include/asm-generic/unistd.h",
]


class CheckFailed(Exception):
    """One failed check; the message says what and where."""


# ---------------------------------------------------------------- tools


def _pins_stamp() -> str:
    text = json.dumps([PIP_REQUIREMENTS, WHEELS], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(
            f"check.py: installing {what} failed ({' '.join(cmd)}):\n"
            f"{r.stdout[-2000:]}{r.stderr[-2000:]}"
        )


def install_tools() -> None:
    """Creates target/deploy-tools (venv + unpacked native tools) once per pin set."""
    stamp = TOOLS / f".installed-{_pins_stamp()}"
    if stamp.exists():
        return
    # Checks may start at once (the test suite runs its tests in
    # parallel): one installs, the others wait for it and find the stamp.
    TOOLS.parent.mkdir(parents=True, exist_ok=True)
    with open(TOOLS.parent / "deploy-tools.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            _install(stamp)


def _install(stamp: Path) -> None:
    t0 = time.monotonic()
    print(f"check.py: installing pinned tools into {TOOLS} ...", file=sys.stderr)
    if TOOLS.exists():
        shutil.rmtree(TOOLS)
    TOOLS.mkdir(parents=True)
    _run([sys.executable, "-m", "venv", str(VENV)], "a virtual environment (python3 -m venv; Debian: apt-get install python3-venv)")
    pip = str(VENV / "bin" / "pip")
    _run([pip, "install", "--quiet", "--disable-pip-version-check", *PIP_REQUIREMENTS], "kubernetes-validate")
    wheels = TOOLS / "wheels"
    for name, w in WHEELS.items():
        _run(
            [pip, "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", "--python-version", w["python"],
             "--platform", "manylinux_2_34_x86_64", "--platform", "any",
             "-d", str(wheels), f"{name}=={w['version']}"],
            f"{name} {w['version']} (PyPI wheel)",
        )
        path = wheels / w["file"]
        if not path.exists():
            sys.exit(f"check.py: pip did not produce {path} for {name}=={w['version']}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != w["sha256"]:
            sys.exit(f"check.py: {path.name} has sha256 {digest}, pinned {w['sha256']}: refusing it")
        out = TOOLS / name
        with zipfile.ZipFile(path) as z:
            z.extract(w["member"], out)
        (out / w["member"]).chmod(0o755)
    stamp.write_text(f"installed in {time.monotonic() - t0:.1f} s\n")
    print(f"check.py: tools installed in {time.monotonic() - t0:.1f} s", file=sys.stderr)


def ensure_in_venv() -> None:
    """Installs the tools if needed and re-runs this script with the venv's Python."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    install_tools()
    py = str(VENV / "bin" / "python3")
    os.execv(py, [py, str(Path(__file__).resolve()), *sys.argv[1:]])


class Kustomize:
    """The Kustomize API from the pykustomize wheel's shared library."""

    def __init__(self) -> None:
        path = TOOLS / "pykustomize" / WHEELS["pykustomize"]["member"]
        self.lib = ctypes.CDLL(str(path))
        self.lib.pykustomize_build.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.pykustomize_build.restype = ctypes.c_int
        self.lib.pykustomize_last_error.restype = ctypes.c_void_p
        self.lib.pykustomize_free.argtypes = [ctypes.c_void_p]
        self.lib.pykustomize_version_string.restype = ctypes.c_void_p
        self.version = self._take(self.lib.pykustomize_version_string(), free=False)

    def _take(self, ptr: int | None, free: bool = True) -> str:
        if not ptr:
            return ""
        s = ctypes.string_at(ptr).decode()
        if free:
            self.lib.pykustomize_free(ptr)
        return s

    def build(self, path: Path) -> str:
        opts = json.dumps({"load_restrictions": 0, "reorder": "unspecified", "add_managedby_label": False,
                           "enable_plugins": False, "enable_helm": False, "helm_command": ""})
        out = ctypes.c_void_p()
        rc = self.lib.pykustomize_build(str(path).encode(), opts.encode(), ctypes.byref(out))
        if rc != 0:
            err = self._take(self.lib.pykustomize_last_error(), free=False) or "unknown error"
            raise CheckFailed(f"kustomize build {path} failed: {err}")
        return self._take(out.value)


# ---------------------------------------------------------------- helpers


def load_docs(text: str) -> list[dict]:
    import yaml

    return [d for d in yaml.safe_load_all(text) if d]


def one(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]
    if len(found) != 1:
        raise CheckFailed(f"expected exactly one {kind}{' ' + name if name else ''}, found {len(found)}")
    return found[0]


def documented_capabilities(docs_md: Path) -> list[str]:
    """The capabilities docs/deploy.md's privileges table marks as `base`."""
    if not docs_md.exists():
        raise CheckFailed(f"{docs_md} is missing (it documents the capability list)")
    caps = []
    for line in docs_md.read_text().splitlines():
        m = re.match(r"^\|\s*`CAP_([A-Z_]+)`\s*\|\s*base\s*\|", line)
        if m:
            caps.append(m.group(1))
    if not caps:
        raise CheckFailed(f"{docs_md}: no `CAP_X` | base | rows in the privileges table")
    return caps


def documented_overlay_capabilities(docs_md: Path) -> dict[str, list[str]]:
    """The capabilities docs/deploy.md's privileges table marks as added by
    an overlay (`overlays/NAME`), per overlay; they must be exactly
    OVERLAY_ADDED_CAPS."""
    if not docs_md.exists():
        raise CheckFailed(f"{docs_md} is missing (it documents the capability list)")
    found: dict[str, list[str]] = {}
    for line in docs_md.read_text().splitlines():
        m = re.match(r"^\|\s*`CAP_([A-Z_]+)`\s*\|\s*overlays/([a-z0-9-]+)(?:\s+only)?\s*\|", line)
        if m:
            found.setdefault(m.group(2), []).append(m.group(1))
    for overlay in sorted(set(found) | set(OVERLAY_ADDED_CAPS)):
        if found.get(overlay, []) != OVERLAY_ADDED_CAPS.get(overlay, []):
            raise CheckFailed(f"docs/deploy.md: the privileges table marks {found.get(overlay, [])} as added by overlays/{overlay}, "
                              f"the overlay adds {OVERLAY_ADDED_CAPS.get(overlay, [])} (rows `CAP_X` | overlays/{overlay})")
    return found


def first_difference(a: object, b: object, path: str = "") -> str | None:
    """The path of the first place where two parsed YAML values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return f"{path}/{k}"
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}/{i}")
            if d:
                return d
        return f"{path}/{min(len(a), len(b))}" if len(a) != len(b) else None
    return None if a == b else path or "/"


def check_only_added_caps(variant: str, objs: list[dict], base_objs: list[dict] | None) -> str:
    """An OVERLAY_ADDED_CAPS variant is the base with exactly those
    capabilities appended to the agent's, nothing else changed (privileges,
    mounts, seccomp, args, every other object)."""
    import copy

    added = OVERLAY_ADDED_CAPS[variant]
    if base_objs is None:
        raise CheckFailed(f"{variant}: the base did not render, nothing to compare overlays/{variant} with")
    mine = copy.deepcopy(objs)
    caps = agent_container(one(mine, "DaemonSet", "tokentap")).get("securityContext", {}).get("capabilities") or {}
    add = caps.get("add") or []
    if add[len(add) - len(added):] != added:
        raise CheckFailed(f"{variant}: capabilities.add is {add}, expected the base's followed by {added}")
    caps["add"] = add[:len(add) - len(added)]
    if len(mine) != len(base_objs):
        raise CheckFailed(f"{variant}: renders {len(mine)} objects, the base {len(base_objs)}; overlays/{variant} may only add {added}")
    for o, b in zip(mine, base_objs):
        d = first_difference(o, b)
        if d:
            raise CheckFailed(f"{variant}: {o.get('kind')} {o.get('metadata', {}).get('name')} differs from the base at {d}; "
                              f"overlays/{variant} may only add {added} to the agent's capabilities")
    return f"the base + {', '.join(added)}, nothing else changed"


def agent_container(ds: dict) -> dict:
    cs = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    if len(cs) != 1:
        raise CheckFailed("the DaemonSet has no container named agent")
    return cs[0]


def all_containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", []) + spec.get("ephemeralContainers", [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- invariants


def check_agent_invariants(variant: str, objs: list[dict], doc_caps: list[str],
                           base_objs: list[dict] | None = None) -> list[str]:
    """Security and wiring invariants of one rendered agent variant. Returns
    notes. base_objs: the base's render, which an OVERLAY_ADDED_CAPS variant
    must equal but for its capabilities."""
    notes = []
    privileged_variant = variant == "privileged"
    kube_variant = variant == "kube-metadata"

    for o in objs:
        for c in all_containers(o):
            sc = c.get("securityContext") or {}
            if sc.get("privileged") and not privileged_variant:
                raise CheckFailed(f"{variant}: container {c['name']} of {o['kind']} {o['metadata']['name']} is privileged; only overlays/privileged may be")
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        if spec.get("hostNetwork"):
            raise CheckFailed(f"{variant}: {o['kind']} {o['metadata']['name']} uses hostNetwork")
        if spec.get("hostIPC"):
            raise CheckFailed(f"{variant}: {o['kind']} {o['metadata']['name']} uses hostIPC")

    ds = one(objs, "DaemonSet", "tokentap")
    pod = ds["spec"]["template"]["spec"]
    c = agent_container(ds)
    sc = c.get("securityContext") or {}

    if pod.get("hostPID") is not True:
        raise CheckFailed(f"{variant}: hostPID is not true (the agent cannot see the engines' processes)")

    if privileged_variant:
        if sc.get("privileged") is not True:
            raise CheckFailed("privileged: the fallback overlay does not make the agent privileged")
        labels = ds["metadata"].get("labels", {})
        if labels.get("tokentap.dev/variant") != "privileged-fallback":
            raise CheckFailed("privileged: DaemonSet not labelled tokentap.dev/variant=privileged-fallback")
    else:
        caps = sc.get("capabilities") or {}
        if caps.get("drop") != ["ALL"]:
            raise CheckFailed(f"{variant}: capabilities.drop is {caps.get('drop')}, expected [ALL]")
        want_caps = doc_caps + OVERLAY_ADDED_CAPS.get(variant, [])
        if caps.get("add") != want_caps:
            raise CheckFailed(f"{variant}: capabilities.add is {caps.get('add')}, docs/deploy.md documents {want_caps}"
                              + (f" (the base's + {OVERLAY_ADDED_CAPS[variant]} of overlays/{variant})" if variant in OVERLAY_ADDED_CAPS else ""))
        if sc.get("allowPrivilegeEscalation") is not False:
            raise CheckFailed(f"{variant}: allowPrivilegeEscalation is not false")
    if sc.get("readOnlyRootFilesystem") is not True:
        raise CheckFailed(f"{variant}: readOnlyRootFilesystem is not true")
    if sc.get("runAsUser") != 0:
        raise CheckFailed(f"{variant}: runAsUser is {sc.get('runAsUser')}, expected 0 (added capabilities are effective only for uid 0)")

    # Seccomp: the base's Localhost profile, installed by its init
    # container; Unconfined only in the fallback overlay.
    seccomp = (sc.get("seccompProfile") or {})
    unconfined_variant = variant in UNCONFINED_VARIANTS
    if unconfined_variant:
        if seccomp != {"type": "Unconfined"}:
            raise CheckFailed(f"{variant}: seccompProfile is {seccomp}, expected Unconfined (this overlay's one change)")
        if pod.get("initContainers"):
            raise CheckFailed(f"{variant}: init containers {[i['name'] for i in pod['initContainers']]} remain; Unconfined installs nothing")
    elif not privileged_variant and seccomp != {"type": "Localhost", "localhostProfile": LOCALHOST_PROFILE}:
        raise CheckFailed(f"{variant}: seccompProfile is {seccomp}, expected Localhost {LOCALHOST_PROFILE} "
                          "(the base's default; Unconfined only in overlays/seccomp-unconfined)")
    if not unconfined_variant:
        notes.append(check_seccomp_installer(variant, objs, pod))

    # hostPath volumes: only the allowed ones, each mounted read-only; the
    # kubelet's seccomp root (writable) only where the installer runs, and
    # only in it (check_seccomp_installer).
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    host_vols = {n: v["hostPath"]["path"] for n, v in vols.items() if "hostPath" in v}
    allowed_paths = ALLOWED_HOST_PATHS | (set() if unconfined_variant else {KUBELET_SECCOMP_ROOT})
    extra = set(host_vols.values()) - allowed_paths
    if extra:
        raise CheckFailed(f"{variant}: hostPath volumes outside the allowed set: {sorted(extra)}")
    for o in objs:
        for cc in all_containers(o):
            for m in cc.get("volumeMounts", []):
                if m["name"] in host_vols and o is ds and m.get("readOnly") is not True \
                        and not (host_vols[m["name"]] == KUBELET_SECCOMP_ROOT and cc["name"] == SECCOMP_INIT):
                    raise CheckFailed(f"{variant}: hostPath {host_vols[m['name']]} mounted writable at {m['mountPath']} in {cc['name']}")
    for n, path in host_vols.items():
        if path == KUBELET_SECCOMP_ROOT:
            continue
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] == n]
        if not mounts or any(m["mountPath"] != path for m in mounts):
            raise CheckFailed(f"{variant}: hostPath {path} must be mounted at the same path in the agent")
    if "/sys/kernel/tracing" not in host_vols.values():
        raise CheckFailed(f"{variant}: tracefs (/sys/kernel/tracing) is not mounted")

    # Probes on the health port that --health-addr serves.
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    addr = [a.split("=", 1)[1] for a in c.get("args", []) if a.startswith("--health-addr=")]
    if len(addr) != 1:
        raise CheckFailed(f"{variant}: the agent's args need exactly one --health-addr=HOST:PORT")
    if ports.get("health") != int(addr[0].rsplit(":", 1)[1]):
        raise CheckFailed(f"{variant}: container port 'health' {ports.get('health')} is not --health-addr {addr[0]}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or get.get("port") not in ("health", ports.get("health")):
            raise CheckFailed(f"{variant}: {probe} must be GET {path} on the health port, is {c.get(probe)}")

    # Service-account token only with --kube-metadata.
    sa = one(objs, "ServiceAccount", pod.get("serviceAccountName", "default"))
    for what, val in (("ServiceAccount", sa.get("automountServiceAccountToken")),
                      ("pod spec", pod.get("automountServiceAccountToken"))):
        if val is not kube_variant:
            raise CheckFailed(f"{variant}: automountServiceAccountToken on the {what} is {val}, expected {kube_variant}")
    if ("--kube-metadata" in c.get("args", [])) is not kube_variant:
        raise CheckFailed(f"{variant}: --kube-metadata must be given exactly in overlays/kube-metadata")
    check_rbac(variant, objs, allowed={("", "pods")})
    if kube_variant:
        binds = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
        if not any(s.get("name") == sa["metadata"]["name"] for b in binds for s in b.get("subjects", [])):
            raise CheckFailed("kube-metadata: no binding gives the agent's ServiceAccount its role")

    # Downward API, NVML without a GPU claim, GPU scheduling.
    env = {e["name"]: e for e in c.get("env", [])}
    field = lambda n: ((env.get(n) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
    if field("NODE_NAME") != "spec.nodeName" or field("POD_UID") != "metadata.uid":
        raise CheckFailed(f"{variant}: NODE_NAME/POD_UID must come from the downward API")
    if (env.get("NVIDIA_VISIBLE_DEVICES") or {}).get("value") != "all" or \
            (env.get("NVIDIA_DRIVER_CAPABILITIES") or {}).get("value") != "utility":
        raise CheckFailed(f"{variant}: NVML env (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility) missing")
    res = c.get("resources") or {}
    if any("nvidia.com/gpu" in (res.get(k) or {}) for k in ("requests", "limits")):
        raise CheckFailed(f"{variant}: the agent must not claim a GPU")
    if not (res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory") and res.get("limits", {}).get("memory")):
        raise CheckFailed(f"{variant}: cpu/memory requests and a memory limit are required")
    if not any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" for t in pod.get("tolerations", [])):
        raise CheckFailed(f"{variant}: no toleration for nvidia.com/gpu")
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t.get("matchExpressions", [])}
    if keys != {"nvidia.com/gpu.present", "cloud.google.com/gke-accelerator"}:
        raise CheckFailed(f"{variant}: GPU node affinity keys are {sorted(keys)}")

    # The config the DaemonSet mounts points at the collector's Service.
    cms = [o for o in objs if o["kind"] == "ConfigMap" and "config.toml" in o.get("data", {})]
    if len(cms) != 1:
        raise CheckFailed(f"{variant}: expected one ConfigMap with config.toml")
    cfg = tomllib.loads(cms[0]["data"]["config.toml"])
    m = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)", cfg.get("otlp-endpoint", ""))
    if not m:
        raise CheckFailed(f"{variant}: config.toml otlp-endpoint {cfg.get('otlp-endpoint')!r} is not a Service URL")
    notes.append(f"otlp-endpoint {m.group(1)}.{m.group(2)}:{m.group(3)}")
    if variant in OVERLAY_ADDED_CAPS:
        notes.append(check_only_added_caps(variant, objs, base_objs))
    return notes


def check_seccomp_installer(variant: str, objs: list[dict], pod: dict) -> str:
    """The init container that installs the agent's Localhost profile:
    minimal privileges, the profile byte for byte, written where the agent's
    localhostProfile points, and the kubelet's seccomp root mounted by it
    alone."""
    inits = pod.get("initContainers") or []
    if [i["name"] for i in inits] != [SECCOMP_INIT]:
        raise CheckFailed(f"{variant}: init containers are {[i['name'] for i in inits]}, expected exactly [{SECCOMP_INIT}] "
                          f"(it installs the Localhost seccomp profile)")
    ic = inits[0]
    isc = ic.get("securityContext") or {}
    if isc != SECCOMP_INIT_SECURITY_CONTEXT:
        raise CheckFailed(f"{variant}: init container {SECCOMP_INIT} securityContext is {isc}, "
                          f"expected exactly {SECCOMP_INIT_SECURITY_CONTEXT}")
    if not (ic.get("resources") or {}).get("limits", {}).get("memory"):
        raise CheckFailed(f"{variant}: init container {SECCOMP_INIT} has no memory limit")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = ic.get("volumeMounts") or []
    host = [m for m in mounts if "hostPath" in vols.get(m["name"], {})]
    cms = [m for m in mounts if "configMap" in vols.get(m["name"], {})]
    if len(mounts) != 2 or len(host) != 1 or len(cms) != 1:
        raise CheckFailed(f"{variant}: init container {SECCOMP_INIT} must mount exactly the profile's ConfigMap and "
                          f"the kubelet's seccomp root, mounts {[m['name'] for m in mounts]}")
    host_path = vols[host[0]["name"]]["hostPath"]["path"]
    if host_path != KUBELET_SECCOMP_ROOT:
        raise CheckFailed(f"{variant}: init container {SECCOMP_INIT} writes hostPath {host_path}, expected {KUBELET_SECCOMP_ROOT}")
    if cms[0].get("readOnly") is not True:
        raise CheckFailed(f"{variant}: the profile's ConfigMap is mounted writable in {SECCOMP_INIT}")
    cm = one(objs, "ConfigMap", vols[cms[0]["name"]]["configMap"]["name"])
    data = (cm.get("data") or {}).get(SECCOMP_PROFILE_FILE.name)
    if data is None or data.encode() != SECCOMP_PROFILE_FILE.read_bytes():
        raise CheckFailed(f"{variant}: ConfigMap {cm['metadata']['name']} key {SECCOMP_PROFILE_FILE.name} differs from "
                          f"{SECCOMP_PROFILE_FILE.relative_to(REPO)} (the profile must be shipped byte for byte)")
    # What it copies and where: SRC and DST in its environment, used by its
    # script; DST is the kubelet's seccomp root + the agent's localhostProfile.
    env = {e["name"]: e.get("value") for e in ic.get("env", [])}
    want = {"SRC": f"{cms[0]['mountPath']}/{SECCOMP_PROFILE_FILE.name}",
            "DST": f"{host[0]['mountPath']}/{LOCALHOST_PROFILE}"}
    if {k: env.get(k) for k in want} != want:
        raise CheckFailed(f"{variant}: init container {SECCOMP_INIT} env SRC/DST is {[env.get('SRC'), env.get('DST')]}, "
                          f"expected {[want['SRC'], want['DST']]} (the agent's localhostProfile under the kubelet's seccomp root)")
    script = " ".join(ic.get("command", []) + ic.get("args", []))
    if '"$SRC"' not in script or 'mv -f "$DST.tmp" "$DST"' not in script:
        raise CheckFailed(f"{variant}: init container {SECCOMP_INIT}'s script does not copy $SRC and rename it onto $DST")
    # Nobody else mounts the kubelet's seccomp root or the profile.
    for c in pod.get("containers", []) + inits[1:] + pod.get("ephemeralContainers", []):
        for m in c.get("volumeMounts", []):
            if m["name"] in (host[0]["name"], cms[0]["name"]):
                raise CheckFailed(f"{variant}: container {c['name']} mounts {m['name']}; only the init container {SECCOMP_INIT} may")
    return f"{SECCOMP_INIT} installs {cm['metadata']['name']} at {KUBELET_SECCOMP_ROOT}/{LOCALHOST_PROFILE} (uid 0, no capability, RuntimeDefault)"


def check_rbac(variant: str, objs: list[dict], allowed: set[tuple[str, str]]) -> None:
    for o in objs:
        if o["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in o.get("rules", []):
            verbs = set(rule.get("verbs", []))
            if not verbs or not verbs <= {"get", "list", "watch"}:
                raise CheckFailed(f"{variant}: {o['kind']} {o['metadata']['name']} grants verbs {sorted(verbs)}; only get/list/watch allowed")
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    if (g, r) not in allowed:
                        raise CheckFailed(f"{variant}: {o['kind']} {o['metadata']['name']} grants {r} in group {g!r}; allowed: {sorted(allowed)}")
            if rule.get("nonResourceURLs"):
                raise CheckFailed(f"{variant}: {o['kind']} {o['metadata']['name']} grants nonResourceURLs")


def check_collector(objs: list[dict], agent_objs: list[dict]) -> tuple[dict, list[str]]:
    """Structural checks of the collector config and its wiring. Returns the config."""
    import yaml

    notes = []
    check_rbac("collector", objs, allowed={("", "pods"), ("", "namespaces"), ("apps", "replicasets")})
    cm = one(objs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    for section in ("receivers", "processors", "exporters", "service"):
        if not isinstance(cfg.get(section), dict):
            raise CheckFailed(f"collector config: missing section {section}")
    defined = {k: set(cfg.get(k) or {}) for k in ("receivers", "processors", "exporters", "extensions")}
    for ext in cfg["service"].get("extensions", []):
        if ext not in defined["extensions"]:
            raise CheckFailed(f"collector config: service extension {ext} is not defined")
    pipes = cfg["service"].get("pipelines") or {}
    if "metrics" not in pipes:
        raise CheckFailed("collector config: no metrics pipeline")
    for name, p in pipes.items():
        for kind in ("receivers", "processors", "exporters"):
            for comp in p.get(kind, []):
                if comp not in defined[kind]:
                    raise CheckFailed(f"collector config: pipeline {name} uses {kind[:-1]} {comp}, which is not defined")
        procs = p.get("processors", [])
        if "k8sattributes" not in procs or procs[-1] != "batch" or procs[0] != "memory_limiter":
            raise CheckFailed(f"collector config: pipeline {name} must run memory_limiter first, k8sattributes, batch last; has {procs}")
    for name, p in pipes.items():
        if p.get("receivers") != ["otlp"]:
            raise CheckFailed(f"collector config: pipeline {name} receivers {p.get('receivers')}, expected [otlp]")
    if set(pipes["metrics"]["exporters"]) != {"prometheus", "otlp"}:
        raise CheckFailed("collector config: metrics must go to prometheus and otlp")

    k8s = cfg["processors"]["k8sattributes"]
    assoc = [[(s.get("from"), s.get("name")) for s in r.get("sources", [])] for r in k8s.get("pod_association", [])]
    if assoc != [[("resource_attribute", "k8s.pod.uid")], [("resource_attribute", "container.id")]]:
        raise CheckFailed(f"collector config: k8sattributes pod_association must be k8s.pod.uid then container.id (resource attributes), is {assoc}")
    if k8s.get("passthrough"):
        raise CheckFailed("collector config: k8sattributes passthrough would skip the metadata lookup")
    meta = set((k8s.get("extract") or {}).get("metadata", []))
    for need in ("k8s.namespace.name", "k8s.pod.name", "k8s.deployment.name"):
        if need not in meta:
            raise CheckFailed(f"collector config: k8sattributes does not extract {need}")

    # Ports: config endpoints == container ports == Service target ports;
    # the agent's otlp-endpoint names this Service and its gRPC port.
    dep = one(objs, "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    cports = {p["name"]: p["containerPort"] for p in c["ports"]}
    def port_of(ep: str) -> int:
        return int(str(ep).rsplit(":", 1)[1])
    want = {
        "otlp-grpc": port_of(cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]),
        "otlp-http": port_of(cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"]),
        "prometheus": port_of(cfg["exporters"]["prometheus"]["endpoint"]),
        "health": port_of(cfg["extensions"]["health_check"]["endpoint"]),
    }
    for n, p in want.items():
        if cports.get(n) != p:
            raise CheckFailed(f"collector: container port {n} is {cports.get(n)}, config listens on {p}")
    for probe in ("livenessProbe", "readinessProbe"):
        if (c.get(probe) or {}).get("httpGet", {}).get("port") != "health":
            raise CheckFailed(f"collector: {probe} must use the health_check port")
    svc = one(objs, "Service")
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    agent_cfg = tomllib.loads(one([o for o in agent_objs if o["kind"] == "ConfigMap" and "config.toml" in o.get("data", {})], "ConfigMap")["data"]["config.toml"])
    m = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)", agent_cfg["otlp-endpoint"])
    assert m, "checked by the agent invariants"
    if (m.group(1), m.group(2)) != (svc["metadata"]["name"], svc["metadata"].get("namespace")):
        raise CheckFailed(f"agent otlp-endpoint names {m.group(1)}.{m.group(2)}, the collector Service is {svc['metadata']['name']}.{svc['metadata'].get('namespace')}")
    grpc = sports.get("otlp-grpc") or {}
    if grpc.get("port") != int(m.group(3)) or grpc.get("targetPort") != "otlp-grpc":
        raise CheckFailed(f"agent exports to port {m.group(3)}, the Service's otlp-grpc port is {grpc}")
    if agent_cfg.get("otlp-protocol", "grpc") != "grpc":
        raise CheckFailed("agent config: otlp-protocol must be grpc for port 4317")
    sel = svc["spec"]["selector"]
    if any(dep["spec"]["template"]["metadata"]["labels"].get(k) != v for k, v in sel.items()):
        raise CheckFailed("collector Service selector does not select the collector pods")
    notes.append(f"association {' > '.join(n for r in assoc for _, n in r)}; pipelines {sorted(pipes)}")
    return cfg, notes


def check_seccomp_profile() -> list[str]:
    prof = json.loads(SECCOMP_PROFILE_FILE.read_text())
    if prof.get("defaultAction") != "SCMP_ACT_ERRNO":
        raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: defaultAction must be SCMP_ACT_ERRNO (an allow-list)")
    known: set[str] = set()
    for h in SYSCALL_HEADERS:
        if Path(h).exists():
            known |= set(re.findall(r"#define __NR(?:3264)?_([a-z0-9_]+)\s", Path(h).read_text()))
    if not known:
        raise CheckFailed(f"no kernel syscall headers at {SYSCALL_HEADERS} (Debian: apt-get install linux-libc-dev)")
    allowed, seen = set(), set()
    for rule in prof["syscalls"]:
        if rule.get("action") not in ("SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"):
            raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: unexpected action {rule.get('action')}")
        for n in rule["names"]:
            if n not in known:
                raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: {n!r} is not a syscall name in the kernel headers")
            if n in seen and n != "personality":
                raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: {n} is listed twice")
            seen.add(n)
            if rule["action"] == "SCMP_ACT_ALLOW":
                allowed.add(n)
    missing = [s for s in AGENT_SYSCALLS if s not in allowed]
    if missing:
        raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: the agent's syscalls {missing} are not allowed")
    for name, errno in AGENT_SYSCALLS_ERRNO.items():
        rules = [r for r in prof["syscalls"] if name in r["names"]]
        if [(r["action"], r.get("errnoRet"), r.get("args")) for r in rules] != [("SCMP_ACT_ERRNO", errno, None)]:
            raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: {name} must be answered errno {errno} (the agent's libc falls back on it)")
    for must in ("bpf", "perf_event_open"):
        if must not in allowed:
            raise CheckFailed(f"{SECCOMP_PROFILE_FILE}: {must} not allowed")
    return [f"{len(allowed)} calls allowed, all {len(AGENT_SYSCALLS)} agent calls among them "
            f"({', '.join(f'{n} errno {e}' for n, e in AGENT_SYSCALLS_ERRNO.items())} by design), "
            f"names checked against {len(known)} kernel names"]


def container_spec(objs: list[dict]) -> dict:
    """The agent container's privileges as the container test needs them,
    with the files its ConfigMap volumes put in the container.

    seccomp: "Unconfined", "RuntimeDefault", or "Localhost:<absolute path of
    the profile file>" — for the base, the file its init container installs
    (checked byte for byte against the rendered ConfigMap before this runs),
    so the test runs the image under exactly the base's profile."""
    ds = one(objs, "DaemonSet", "tokentap")
    pod = ds["spec"]["template"]["spec"]
    c = agent_container(ds)
    sc = c.get("securityContext") or {}
    seccomp = sc.get("seccompProfile") or pod.get("securityContext", {}).get("seccompProfile") or {"type": "RuntimeDefault"}
    if seccomp["type"] == "Localhost":
        if seccomp.get("localhostProfile") != LOCALHOST_PROFILE:
            raise CheckFailed(f"container spec: localhostProfile {seccomp.get('localhostProfile')} is not the shipped {LOCALHOST_PROFILE}")
        seccomp_s = f"Localhost:{SECCOMP_PROFILE_FILE}"
    else:
        seccomp_s = seccomp["type"]
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    host_paths = [
        {"host": vols[m["name"]]["hostPath"]["path"], "container": m["mountPath"], "read_only": bool(m.get("readOnly"))}
        for m in c.get("volumeMounts", []) if "hostPath" in vols.get(m["name"], {})
    ]
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = {"fieldRef": e["valueFrom"]["fieldRef"]["fieldPath"]}
    config_files = {}
    for m in c.get("volumeMounts", []):
        ref = vols.get(m["name"], {}).get("configMap")
        if ref:
            cm = one(objs, "ConfigMap", ref["name"])
            for key, text in cm.get("data", {}).items():
                config_files[f"{m['mountPath']}/{key}"] = text
    return {
        "capabilities_add": (sc.get("capabilities") or {}).get("add", []),
        "capabilities_drop": (sc.get("capabilities") or {}).get("drop", []),
        "host_pid": bool(pod.get("hostPID")),
        "host_network": bool(pod.get("hostNetwork")),
        "seccomp": seccomp_s,
        "read_only_root": bool(sc.get("readOnlyRootFilesystem")),
        "run_as_user": sc.get("runAsUser"),
        "privileged": bool(sc.get("privileged")),
        "host_paths": host_paths,
        "writable_paths": [m["mountPath"] for m in c.get("volumeMounts", [])
                           if "emptyDir" in vols.get(m["name"], {})],
        "env": env,
        "args": c.get("args", []),
        "health_port": next((p["containerPort"] for p in c.get("ports", []) if p.get("name") == "health"), None),
        "config_files": config_files,
        "resources": c.get("resources", {}),
    }


# ---------------------------------------------------------------- tools' checks


def validate_schemas(variant: str, objs: list[dict], k8s_version: str) -> int:
    """kubernetes-validate --strict on every object, with the network blocked."""
    import kubernetes_validate

    real_socket = socket.socket

    class NoNetwork(real_socket):  # type: ignore[misc, valid-type]
        def connect(self, *a, **k):  # noqa: ANN
            raise CheckFailed("kubernetes-validate tried to use the network")

    socket.socket = NoNetwork  # type: ignore[misc]
    try:
        for o in objs:
            try:
                kubernetes_validate.validate(o, k8s_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                raise CheckFailed(f"{variant}: {o['kind']} {o['metadata'].get('name')}: {e.message} (at {path}) [Kubernetes {k8s_version}, strict]")
            except kubernetes_validate.SchemaNotFoundError as e:
                raise CheckFailed(f"{variant}: {e.message}")
    finally:
        socket.socket = real_socket  # type: ignore[misc]
    return len(objs)


def run_rotel(cfg: dict) -> str:
    """Runs Rotel with the subset of the collector config it understands.

    Rotel takes flags, not the collector's YAML: the OTLP receivers (gRPC and
    HTTP, on local ports instead of 0.0.0.0), the batch size and timeout. An
    OTLP/HTTP JSON export shaped like the agent's (resource carrying
    k8s.pod.uid and container.id) must be accepted and show up in Rotel's
    debug output with those attributes.
    """
    rotel = TOOLS / "rotel" / WHEELS["rotel"]["member"]
    batch = cfg["processors"]["batch"]
    grpc_port, http_port = free_port(), free_port()
    timeout = str(batch["timeout"])
    cmd = [str(rotel), "start",
           "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
           "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
           "--batch-max-size", str(batch["send_batch_size"]),
           "--batch-timeout", timeout,
           "--exporter", "blackhole",
           "--debug-log", "metrics", "--debug-log-verbosity", "detailed"]
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", http_port), timeout=0.5).close()
                    socket.create_connection(("127.0.0.1", grpc_port), timeout=0.5).close()
                    break
                except OSError:
                    if p.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise CheckFailed(f"rotel did not start with {' '.join(cmd)}:\n{log.read()[-2000:]}")
                    time.sleep(0.1)
            pod_uid = "3f0c0b9e-7c1d-4b7e-9a51-0d1c2b3a4f50"
            body = {"resourceMetrics": [{
                "resource": {"attributes": [
                    {"key": "k8s.pod.uid", "value": {"stringValue": pod_uid}},
                    {"key": "container.id", "value": {"stringValue": "c" * 64}},
                    {"key": "service.name", "value": {"stringValue": "tokentap"}}]},
                "scopeMetrics": [{"scope": {"name": "tokentap"}, "metrics": [{
                    "name": "tokentap.check.probe", "unit": "1",
                    "gauge": {"dataPoints": [{"timeUnixNano": str(time.time_ns()), "asDouble": 1.0}]}}]}]}]}
            req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/metrics", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status != 200:
                    raise CheckFailed(f"rotel answered {r.status} to an OTLP/HTTP export")
            # Wait for Rotel's debug output of the export (bounded by the
            # batch timeout from the config, plus slack).
            secs = float(re.fullmatch(r"(\d+(?:\.\d+)?)s", timeout).group(1))  # type: ignore[union-attr]
            deadline = time.monotonic() + secs + 10
            while time.monotonic() < deadline:
                log.seek(0)
                out = log.read()
                if pod_uid in out and "tokentap.check.probe" in out:
                    break
                time.sleep(0.2)
            else:
                raise CheckFailed(f"rotel accepted the export but never showed it:\n{out[-2000:]}")
        finally:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    version = subprocess.run([str(rotel), "--version"], capture_output=True, text=True).stdout.strip()
    return f"{version}: OTLP gRPC+HTTP receivers up, batch {batch['send_batch_size']}/{timeout}, an export with k8s.pod.uid/container.id accepted (200) and in its debug output"


def cross_check_kubectl(path: Path, rendered: list[dict]) -> str | None:
    """When this machine has kubectl, its kustomize must render the same objects."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return None
    r = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckFailed(f"kubectl kustomize {path} failed: {r.stderr.strip()}")
    if load_docs(r.stdout) != rendered:
        raise CheckFailed(f"kubectl kustomize {path} renders differently from the pinned Kustomize")
    return "same as kubectl kustomize"


# ---------------------------------------------------------------- drivers


def render_all(kz: Kustomize, root: Path = REPO) -> dict[str, list[dict]]:
    out = {}
    for name, path in AGENT_VARIANTS.items():
        out[name] = load_docs(kz.build(root / path.relative_to(REPO)))
    return out


def run_checks(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    kz = Kustomize()
    rows: list[tuple[str, str, str]] = []
    failed = False

    def step(name: str, fn) -> object:  # noqa: ANN001
        nonlocal failed
        t = time.monotonic()
        try:
            result = fn()
            detail = result if isinstance(result, str) else ""
            rows.append((name, "ok", f"{detail} ({time.monotonic() - t:.1f} s)".strip()))
            return result
        except CheckFailed as e:
            failed = True
            rows.append((name, "FAIL", str(e)))
            return None

    import kubernetes_validate

    doc_caps = step("docs: documented capabilities", lambda: documented_capabilities(REPO / "docs" / "deploy.md"))
    step("docs: overlay capabilities", lambda: "; ".join(
        f"overlays/{o}: {', '.join(c)}" for o, c in documented_overlay_capabilities(REPO / "docs" / "deploy.md").items()))
    renders = {}
    for name, path in {**AGENT_VARIANTS, "collector": COLLECTOR}.items():
        objs = step(f"render {name}", lambda p=path: load_docs(kz.build(p)))
        if objs is not None:
            renders[name] = objs
            step(f"kubectl agrees {name}", lambda p=path, o=objs: cross_check_kubectl(p, o) or "kubectl not installed: skipped")
            step(f"schemas {name}", lambda n=name, o=objs: f"{validate_schemas(n, o, args.kubernetes_version)} objects valid")
    if isinstance(doc_caps, list):
        for name in AGENT_VARIANTS:
            if name in renders:
                step(f"invariants {name}", lambda n=name: "; ".join(check_agent_invariants(n, renders[n], doc_caps, renders.get("base"))))
    if "default" in renders and "base" in renders and renders["default"] != renders["base"]:
        rows.append(("default == base", "FAIL", "deploy/kubernetes renders differently from its base"))
        failed = True
    step("seccomp profile", lambda: "; ".join(check_seccomp_profile()))
    cfg = None
    if "collector" in renders and "base" in renders:
        res = step("collector config", lambda: check_collector(renders["collector"], renders["base"]))
        if res:
            cfg = res[0]
            rows[-1] = (rows[-1][0], rows[-1][1], "; ".join(res[1]) + " " + rows[-1][2])
    if cfg is not None:
        step("rotel runs the config's subset", lambda: run_rotel(cfg))
    if args.emit_container_spec and "base" in renders and not failed:
        spec = container_spec(renders["base"])
        Path(args.emit_container_spec).write_text(json.dumps(spec, indent=2) + "\n")
        rows.append(("emit container spec", "ok", args.emit_container_spec))

    width = max(len(r[0]) for r in rows)
    print(f"tokentap deploy check — kustomize {kz.version} (api v0.21.3), kubernetes-validate "
          f"{kubernetes_validate.__version__ if hasattr(kubernetes_validate, '__version__') else '1.37.0'} "
          f"(schemas {args.kubernetes_version}, strict)")
    for name, status, detail in rows:
        print(f"  {name:<{width}}  {status:<4}  {detail}")
    print(f"{'FAILED' if failed else 'all checks passed'} in {time.monotonic() - t0:.1f} s")
    return 1 if failed else 0


# Each breakage: (what, file under the copied repo, edit of its text, text
# the failure must contain). Every check of check_tree runs on every copy.
def _breakages() -> list[tuple[str, str, object, str]]:
    ds = "deploy/kubernetes/base/daemonset.yaml"
    sa = "deploy/kubernetes/base/serviceaccount.yaml"
    rbac = "deploy/kubernetes/overlays/kube-metadata/rbac.yaml"
    col = "deploy/collector/config.yaml"
    docs = "docs/deploy.md"
    prof = "deploy/kubernetes/seccomp/agent.json"
    unconf = "deploy/kubernetes/overlays/seccomp-unconfined/kustomization.yaml"
    tls = "deploy/kubernetes/overlays/tls/kustomization.yaml"
    tls_cap = "        path: /spec/template/spec/containers/0/securityContext/capabilities/add/-\n        value: SYS_ADMIN\n"

    def sub(old: str, new: str):  # noqa: ANN202
        def f(text: str) -> str:
            if old not in text:
                raise AssertionError(f"self-test: {old!r} not found")
            return text.replace(old, new, 1)
        return f
    return [
        ("privileged in the base", ds, sub('privileged: false\n            allowPrivilegeEscalation: false\n            readOnlyRootFilesystem: true\n            capabilities:\n              drop: ["ALL"]\n              add:', 'privileged: true\n            allowPrivilegeEscalation: false\n            readOnlyRootFilesystem: true\n            capabilities:\n              drop: ["ALL"]\n              add:'), "container agent of DaemonSet tokentap is privileged; only overlays/privileged"),
        ("privileged installer", ds, sub("privileged: false", "privileged: true"), "container seccomp-profile of DaemonSet tokentap is privileged; only overlays/privileged"),
        ("an extra capability", ds, sub("                - DAC_READ_SEARCH\n", "                - DAC_READ_SEARCH\n                - SYS_ADMIN\n"), "capabilities.add is"),
        ("a capability fewer", ds, sub("                - SYS_PTRACE\n", ""), "capabilities.add is"),
        ("docs drift from the list", docs, sub("| `CAP_DAC_READ_SEARCH` | base |", "| `CAP_DAC_READ_SEARCH` | not added |"), "capabilities.add is"),
        ("capabilities not dropped", ds, sub('drop: ["ALL"]\n              add:', 'drop: ["NET_RAW"]\n              add:'), "capabilities.drop"),
        ("hostPID off", ds, sub("hostPID: true", "hostPID: false"), "hostPID is not true"),
        ("hostNetwork on", ds, sub("hostNetwork: false", "hostNetwork: true"), "uses hostNetwork"),
        ("writable tracefs", ds, sub("mountPath: /sys/kernel/tracing\n              readOnly: true", "mountPath: /sys/kernel/tracing\n              readOnly: false"), "mounted writable"),
        ("another hostPath", ds, sub("path: /sys/fs/cgroup", "path: /var/run"), "outside the allowed set"),
        ("no readiness probe", ds, sub("path: /readyz", "path: /healthz"), "readinessProbe must be GET /readyz"),
        ("probe off the health port", ds, sub("--health-addr=0.0.0.0:9477", "--health-addr=0.0.0.0:9478"), "is not --health-addr"),
        ("writable root filesystem", ds, sub('readOnlyRootFilesystem: true\n            capabilities:\n              drop: ["ALL"]\n              add:', 'readOnlyRootFilesystem: false\n            capabilities:\n              drop: ["ALL"]\n              add:'), "readOnlyRootFilesystem is not true"),
        ("token in the base", sa, sub("automountServiceAccountToken: false", "automountServiceAccountToken: true"), "automountServiceAccountToken on the ServiceAccount"),
        ("RBAC write verb", rbac, sub('verbs: ["get", "list", "watch"]', 'verbs: ["get", "list", "watch", "patch"]'), "only get/list/watch"),
        ("RBAC on secrets", rbac, sub('resources: ["pods"]', 'resources: ["pods", "secrets"]'), "grants secrets"),
        ("GPU claimed", ds, sub("              memory: 256Mi\n", "              memory: 256Mi\n              nvidia.com/gpu: 1\n"), "must not claim a GPU"),
        ("base seccomp Unconfined", ds, sub("type: Localhost\n              localhostProfile: tokentap/agent.json", "type: Unconfined"), "expected Localhost tokentap/agent.json"),
        ("another Localhost profile", ds, sub("localhostProfile: tokentap/agent.json", "localhostProfile: tokentap/other.json"), "expected Localhost tokentap/agent.json"),
        ("profile written elsewhere", ds, sub("value: /host-seccomp/tokentap/agent.json", "value: /host-seccomp/agent.json"), "env SRC/DST"),
        ("profile shipped altered", prof, sub('"defaultErrnoRet": 1,', '"defaultErrnoRet": 38,'), "differs from deploy/kubernetes/seccomp/agent.json"),
        ("installer gains a cap", ds, sub('              drop: ["ALL"]\n            seccompProfile:\n              type: RuntimeDefault', '              drop: ["ALL"]\n              add: ["DAC_OVERRIDE"]\n            seccompProfile:\n              type: RuntimeDefault'), "seccomp-profile securityContext is"),
        ("installer unfiltered", ds, sub("type: RuntimeDefault", "type: Unconfined"), "seccomp-profile securityContext is"),
        ("installer writes elsewhere", ds, sub("path: /var/lib/kubelet/seccomp", "path: /etc"), "writes hostPath /etc"),
        ("agent mounts seccomp root", ds, sub("            - name: state\n              mountPath: /var/lib/tokentap\n", "            - name: state\n              mountPath: /var/lib/tokentap\n            - name: kubelet-seccomp\n              mountPath: /var/lib/kubelet/seccomp\n"), "only the init container seccomp-profile may"),
        ("unconfined keeps installer", unconf, sub("      - op: remove\n        path: /spec/template/spec/initContainers\n", ""), "remain; Unconfined installs nothing"),
        ("unconfined not Unconfined", unconf, sub("          type: Unconfined\n", "          type: RuntimeDefault\n"), "expected Unconfined"),
        ("tls adds another cap", tls, sub(tls_cap, tls_cap + "      - op: add\n        path: /spec/template/spec/containers/0/securityContext/capabilities/add/-\n        value: NET_ADMIN\n"), "tls: capabilities.add is"),
        ("tls without SYS_ADMIN", tls, sub("value: SYS_ADMIN", "value: SYS_RESOURCE"), "tls: capabilities.add is"),
        ("tls changes more", tls, sub(tls_cap, tls_cap + "      - op: add\n        path: /spec/template/spec/containers/0/securityContext/procMount\n        value: Unmasked\n"), "differs from the base at"),
        ("tls seccomp Unconfined", tls, sub(tls_cap, tls_cap + "      - op: replace\n        path: /spec/template/spec/containers/0/securityContext/seccompProfile\n        value:\n          type: Unconfined\n"), "tls: seccompProfile is"),
        ("docs drop the tls row", docs, sub("| `CAP_SYS_ADMIN` | overlays/tls |", "| `CAP_SYS_ADMIN` | not added |"), "as added by overlays/tls"),
        ("unknown field (schema)", ds, sub("      hostIPC: false\n", "      hostIPC: false\n      hostPIDs: true\n"), "hostPIDs"),
        ("wrong type (schema)", ds, sub("maxUnavailable: 1", "maxUnavailable: [1]"), "maxUnavailable"),
        ("association by IP", col, sub("          - from: resource_attribute\n            name: k8s.pod.uid\n", "          - from: connection\n"), "pod_association must be"),
        ("undefined exporter", col, sub("exporters: [prometheus, otlp]", "exporters: [prometheus, otlp, debug]"), "exporter debug, which is not defined"),
        ("kustomization names a missing file", "deploy/kubernetes/base/kustomization.yaml", sub("  - daemonset.yaml\n", "  - daemonset.yaml\n  - missing.yaml\n"), "kustomize build"),
        ("agent misses the Service", "deploy/kubernetes/base/config.toml", sub("http://tokentap-collector.tokentap.svc:4317", "http://otel-collector.tokentap.svc:4317"), "the collector Service is"),
    ]


def check_tree(kz: Kustomize, root: Path, k8s_version: str) -> None:
    """Every check but Rotel's on a copy of deploy/ and docs/ under root."""
    doc_caps = documented_capabilities(root / "docs" / "deploy.md")
    documented_overlay_capabilities(root / "docs" / "deploy.md")
    renders = {}
    for name, path in AGENT_VARIANTS.items():
        renders[name] = load_docs(kz.build(root / path.relative_to(REPO)))
        validate_schemas(name, renders[name], k8s_version)
        check_agent_invariants(name, renders[name], doc_caps, renders.get("base"))
    collector = load_docs(kz.build(root / COLLECTOR.relative_to(REPO)))
    validate_schemas("collector", collector, k8s_version)
    check_collector(collector, renders["base"])


def self_test(k8s_version: str) -> int:
    """Each check must catch its breakage in a copy of the manifests and docs."""
    kz = Kustomize()
    breakages = _breakages()
    ok = 0
    problems = []

    def copy(root: Path) -> None:
        shutil.copytree(DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
        (root / "docs").mkdir()
        shutil.copy(REPO / "docs" / "deploy.md", root / "docs" / "deploy.md")

    with tempfile.TemporaryDirectory(prefix="tokentap-deploy-selftest-") as tmp:
        # The unbroken copy must pass, so each catch below is its breakage's.
        root = Path(tmp) / "unbroken"
        copy(root)
        try:
            check_tree(kz, root, k8s_version)
            print("  passes  the unbroken copy")
        except CheckFailed as e:
            problems.append(f"the unbroken copy fails: {e}")
            print(f"  FAILS   the unbroken copy: {e}")
        for what, rel, edit, expect in breakages:
            root = Path(tmp) / re.sub(r"\W+", "-", what)
            copy(root)
            f = root / rel
            f.write_text(edit(f.read_text()))  # type: ignore[operator]
            caught = None
            try:
                check_tree(kz, root, k8s_version)
            except CheckFailed as e:
                caught = str(e)
            if caught and expect in caught:
                ok += 1
                print(f"  caught  {what:<26}  {caught}")
            else:
                problems.append(f"{what}: {'not caught' if not caught else 'caught for another reason: ' + caught}")
                print(f"  MISSED  {what:<26}  {caught}")
    print(f"self-test: {ok} of {len(breakages)} breakages caught" + ("" if not problems else "; " + "; ".join(problems)))
    return 0 if not problems else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emit-container-spec", metavar="FILE")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--kubernetes-version", default=DEFAULT_K8S_VERSION)
    args = ap.parse_args()
    ensure_in_venv()
    if args.self_test:
        return self_test(args.kubernetes_version)
    return run_checks(args)


if __name__ == "__main__":
    sys.exit(main())
