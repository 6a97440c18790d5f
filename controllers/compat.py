"""One import shim: the same app runs on os-ken (maintained) or an old Ryu."""
try:  # os-ken 4.x: Ryu's continuation, same API under os_ken.*
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3
    BaseApp = app_manager.OSKenApp
    FRAMEWORK = "os_ken"
except ImportError:  # pragma: no cover - Ryu 4.34 does not run on Python 3.11
    from ryu.base import app_manager
    from ryu.controller import ofp_event
    from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
    from ryu.lib import hub
    from ryu.ofproto import ofproto_v1_3
    BaseApp = app_manager.RyuApp
    FRAMEWORK = "ryu"

__all__ = ["app_manager", "ofp_event", "CONFIG_DISPATCHER", "DEAD_DISPATCHER",
           "MAIN_DISPATCHER", "set_ev_cls", "hub", "ofproto_v1_3", "BaseApp", "FRAMEWORK"]
