"""One import shim: the Ryu API the controller is written against, from os-ken.

os-ken 4.x is Ryu's maintained continuation, the same API under ``os_ken.*``;
Ryu itself (4.34, its last release) does not run on this Python, so the apps
import their framework here, once: a later move (a fork, a rename) is one file.
"""
from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3

BaseApp = app_manager.OSKenApp
FRAMEWORK = "os_ken"

__all__ = ["app_manager", "ofp_event", "CONFIG_DISPATCHER", "DEAD_DISPATCHER",
           "MAIN_DISPATCHER", "set_ev_cls", "hub", "ofproto_v1_3", "BaseApp", "FRAMEWORK"]
