"""The fabric controller os-ken runs: routing, bursts and the port monitor composed in one app.

Why one class: every app os-ken loads receives every switch event, so two
apps that each extend the routing app would both install routes. os-ken
loads the single app class defined in this module (``controllers.run``).
"""
from controllers.bursts_app import FabricBursts
from controllers.monitor_app import FabricMonitor


class FabricController(FabricMonitor, FabricBursts):
    """Routes (``FabricRouting``), bursts (``FabricBursts``), port statistics (``FabricMonitor``)."""
