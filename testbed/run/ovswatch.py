"""Open vSwitch's daemons watched under a running unit, by their PIDs."""
from __future__ import annotations

import os
import pathlib


class OvsWatch:
    """Notices within a poll when Open vSwitch dies under a running arm.

    Without OVS the fabric forwards nothing; workers would only notice at
    their round deadline. Checking the daemons' PIDs costs no process."""

    PIDFILES = ("/var/run/openvswitch/ovs-vswitchd.pid", "/var/run/openvswitch/ovsdb-server.pid")

    def __init__(self):
        self.pids = {}
        for f in self.PIDFILES:
            try:
                self.pids[f] = int(pathlib.Path(f).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass

    def dead(self) -> list[str]:
        out = []
        for f, pid in self.pids.items():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                out.append(pathlib.Path(f).stem)
        return out
