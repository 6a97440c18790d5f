"""The fabric across machines: servers, pod placement, the preflight, the fabric, its agents.

Handed on here: the spec's ``[cluster] servers`` (`testbed.config.servers`, read
by the spec's check too) and a placement that keeps every pod on one server so
only core links cross machines (`topologies.placement`, pure graphs; the class
Mininet's cluster edition takes is `placement`). Built here: the
preflight that refuses a bad server in seconds (`preflight`); the fabric
itself on Mininet's cluster edition (`fabric.ClusterFabric`, its nodes in
`remote`, their ssh in `nodes`, the agent that cleans up each further
server in `agent`); and the rehearsal's machines on this one (`machines`).
`dblp-testbed run` with more than one server runs on it unchanged;
docs/cluster.md says how, and what is not built (Kubernetes).
"""
from testbed.config.servers import (
    LOCAL,
    Server,
    ServerError,
    SshOptionError,
    check_ssh_options,
    parse_server,
    parse_servers,
)
from testbed.emulation.cluster.placement import mininet_placer
from testbed.emulation.cluster.preflight import ClusterError, ServerProblem, check_server, preflight
from topologies.placement import PlacementError, crossing_links, place_pods, pods, top_tier

__all__ = ["LOCAL", "Server", "ServerError", "SshOptionError", "check_ssh_options", "parse_server",
           "parse_servers", "PlacementError",
           "place_pods", "pods", "top_tier", "crossing_links", "mininet_placer", "ClusterError",
           "ServerProblem", "check_server", "preflight"]
