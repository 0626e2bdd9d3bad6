#!/usr/bin/python3
"""Runs a command under an OCI seccomp profile, as a container runtime would.

Owns: turning agent.json into a libseccomp filter (x86_64 + i386) and exec'ing
the command under it, optionally without some of the profile's calls, to try
the profile against the real agent without a cluster:

  /usr/bin/python3 deploy/kubernetes/seccomp/run-under.py \
      deploy/kubernetes/seccomp/agent.json "" tokentap run --port 8000
  # the same without bpf (a negative control): "bpf" as the second argument

Needs Debian's python3-seccomp (for /usr/bin/python3). Must not change the
profile or the machine: the filter applies to the exec'd command only.
"""
import json
import os
import sys

import seccomp

if len(sys.argv) < 4:
    sys.exit(__doc__)
prof = json.load(open(sys.argv[1]))
drop = set(sys.argv[2].split(",")) if sys.argv[2] else set()
f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(prof.get("defaultErrnoRet", 1)))
f.add_arch(seccomp.Arch.X86)
ops = {"SCMP_CMP_EQ": seccomp.EQ, "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ}
skipped = []
for r in prof["syscalls"]:
    act = seccomp.ALLOW if r["action"] == "SCMP_ACT_ALLOW" else seccomp.ERRNO(r["errnoRet"])
    args = []
    for a in r.get("args", []):
        if a["op"] == "SCMP_CMP_MASKED_EQ":
            args.append(seccomp.Arg(a["index"], seccomp.MASKED_EQ, a["value"], a.get("valueTwo", 0)))
        else:
            args.append(seccomp.Arg(a["index"], ops[a["op"]], a["value"]))
    for n in r["names"]:
        if n in drop:
            continue
        try:
            f.add_rule(act, n, *args)
        except (OSError, ValueError, RuntimeError):
            skipped.append(n)
print("skipped (unknown to libseccomp on this arch):", skipped, file=sys.stderr)
f.load()
os.execv(sys.argv[3], sys.argv[3:])
