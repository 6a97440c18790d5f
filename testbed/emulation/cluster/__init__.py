"""The fabric across machines (issue 42): server names, pod placement and the preflight.

Built so far: the spec's ``[cluster] servers`` (`servers`), a placement that
keeps every pod on one server so only core links cross machines
(`placement`), and the preflight that refuses a bad server in seconds
(`preflight`). Not built yet: the fabric itself across machines (tunnels
that OVS terminates, remote hosts and switches, per-server clean-up);
docs/cluster.md says what each part will be.
"""
from testbed.emulation.cluster.placement import (
    PlacementError,
    crossing_links,
    mininet_placer,
    place_pods,
    pods,
    top_tier,
)
from testbed.emulation.cluster.preflight import ClusterError, ServerProblem, check_server, preflight
from testbed.emulation.cluster.servers import (
    LOCAL,
    Server,
    ServerError,
    SshOptionError,
    check_ssh_options,
    parse_server,
    parse_servers,
)

__all__ = ["LOCAL", "Server", "ServerError", "SshOptionError", "check_ssh_options", "parse_server",
           "parse_servers", "PlacementError",
           "place_pods", "pods", "top_tier", "crossing_links", "mininet_placer", "ClusterError",
           "ServerProblem", "check_server", "preflight"]
