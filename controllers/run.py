"""Launch the fabric controller as its own process: ``python -m controllers.run --config FILE``.

os-ken 4.x has no ``osken-manager``: the app is started with
``AppManager.run_apps`` after ``os_ken.cfg.CONF(...)``.
"""
import argparse
import json
import logging
import os
import signal
import sys

APP = "controllers.fabric_app"  # the composed app: routing + bursts + port monitor


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", required=True, help="fabric.json written by testbed.emulation.fabric")
    a = ap.parse_args(argv)
    with open(a.config) as f:
        cfg = json.load(f)
    os.environ["DBLP_FABRIC_CONFIG"] = os.path.abspath(a.config)
    raw = os.path.join(cfg["run_dir"], "raw")
    os.makedirs(raw, exist_ok=True)
    logging.basicConfig(filename=os.path.join(raw, "controller.log"), level=logging.INFO,
                        format="%(created).6f %(name)s %(levelname)s %(message)s")
    from os_ken import cfg as oscfg
    from os_ken.base.app_manager import AppManager

    from controllers.routing_app import FabricRouting

    oscfg.CONF(args=["--ofp-listen-host", cfg.get("of_host", "127.0.0.1"),
                     "--ofp-tcp-listen-port", str(cfg["of_port"])], project="os_ken")

    def stop(*_):
        """End active bursts (their nftables tables, meters, agents) before exiting."""
        mgr = AppManager.get_instance()
        for app in list(mgr.applications.values()):
            if isinstance(app, FabricRouting):
                try:
                    app.close()
                except Exception:
                    logging.exception("close failed")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    AppManager.run_apps([APP])


if __name__ == "__main__":
    sys.exit(main())
