"""`dblp-testbed wireshark`: the dissector of this code's wire format, where Wireshark finds it.

Why a command beside ``python -m dblp.wireshark``: a user who opens a
capture in Wireshark's window wants DBLP decoded without passing
``-X lua_script:`` each time, which means a file in Wireshark's personal Lua
plugins folder. Where that folder is depends on the Wireshark version and
``$HOME``, so the command asks Wireshark itself (``tshark -G folders``) and
falls back to the folder every Wireshark since 2.6 reads
(``~/.local/lib/wireshark/plugins``) when tshark is not installed.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import click

from testbed.errors import InputError

#: The file name the dissector gets in the plugins folder (one file: reinstalling replaces it).
PLUGIN_NAME = "dblp.lua"


def personal_lua_plugins() -> pathlib.Path:
    """Wireshark's personal Lua plugins folder, as the installed Wireshark reports it."""
    tshark = shutil.which("tshark")
    if tshark:
        try:
            out = subprocess.run([tshark, "-G", "folders"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Personal Lua Plugins" and value.strip():
                return pathlib.Path(value.strip())
    return pathlib.Path(os.path.expanduser("~/.local/lib/wireshark/plugins"))


@click.command("wireshark")
@click.option("--install", is_flag=True,
              help="Write it into Wireshark's personal Lua plugins folder "
                   "(Wireshark and tshark then decode DBLP without -X lua_script:).")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="Write it to this file instead of stdout.")
def wireshark_cmd(install, out):
    """The Wireshark dissector for this code's wire format: stdout, a file, or installed."""
    from dblp.wireshark import lua_dissector
    if install and out:
        raise InputError("wireshark: give --install or --out, not both")
    text = lua_dissector()
    if not install and not out:
        click.echo(text, nl=False)
        return
    path = personal_lua_plugins() / PLUGIN_NAME if install else pathlib.Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"wireshark: cannot write {path}: {exc.strerror}; "
                         "give a writable file with --out") from exc
    click.echo(f"dissector written to {path}" + (" (Wireshark loads it at its next start)"
                                                  if install else ""))
