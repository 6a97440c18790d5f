"""topologies package."""
