"""nft scripts for the controller on another machine: one JSON line in, one out.

Why: a ``loss`` burst hooks the egress of a switch port, and a fabric across
machines (testbed.emulation.cluster) has ports on other servers. The
controller starts this agent on each such server once, over the fabric's
multiplexed ssh connection, and sends it each burst's script; the agent runs
it with libnftables in its own process (``controllers.mechanisms.Nft``), as
the controller does for its own machine's ports, so a burst there costs one
round trip on the machines' network more, not an ssh connection.

In: ``{"script": "..."}``, or ``{"tc": [ARGS]}`` (``tc ARGS``: what a
``congest`` burst reads of a port's queue there). Out: ``{"ok": true, "out":
"..."}`` or ``{"ok": false, "error": "..."}``. At the end of stdin it deletes the tables
whose names start with the prefix it was started with (``--prefix``), so a
burst interrupted by the controller's death ends there too.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from controllers.mechanisms import Nft


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controllers.nft_agent")
    ap.add_argument("--prefix", required=True, help="the fabric's nftables table prefix (dtburst_<tag>_)")
    a = ap.parse_args(argv)
    if not a.prefix.startswith("dtburst_"):
        ap.error("--prefix must start with dtburst_")
    nft = Nft()
    print(json.dumps({"ok": True, "in_process": nft.in_process}), flush=True)
    try:
        for line in sys.stdin:
            try:
                req = json.loads(line)
                if "tc" in req:
                    args = req["tc"]
                    if not (isinstance(args, list) and all(isinstance(x, str) for x in args)):
                        raise ValueError("tc: a list of strings")
                    p = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=10)
                    if p.returncode:
                        raise RuntimeError(f"tc {' '.join(args)}: {p.stderr.strip()}")
                    out = p.stdout
                else:
                    out = nft.run(req["script"])
                reply = {"ok": True, "out": out}
            except (ValueError, KeyError, RuntimeError, subprocess.TimeoutExpired) as exc:
                reply = {"ok": False, "error": str(exc)}
            print(json.dumps(reply), flush=True)
    finally:
        try:
            for line in nft.run("list tables\n").splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == "table" and parts[2].startswith(a.prefix):
                    nft.run(f"delete table {parts[1]} {parts[2]}\n")
        except RuntimeError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
