"""Benchmarks: the transport on a shaped veth pair, bursts on the fabric."""
