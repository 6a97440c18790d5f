"""Where ./setup.sh gets torch from: PyTorch's CPU build where its index is reachable,
the public build of the same version otherwise.

Why this is not one line of pip: the lock (constraints.txt) pins torch's
version, and the one wheel that fits a CPU-only testbed (``2.13.0+cpu``,
without the CUDA libraries) is served only by PyTorch's own CPU index. A
machine that sees only the public index must still install the same
version: the public build (on x86-64 it brings CUDA libraries, gigabytes of
them; on aarch64 it is CPU-only anyway). So setup.sh asks this module which
of the two to install, then says which it did.

Stdlib only: setup.sh runs it with the new virtual environment's python
before the project is installed (``python testbed/install.py``). It reads
an index's PEP 503 page for torch (``INDEX/torch/``) over http(s) or from a
``file://`` directory, and picks a wheel for this interpreter and machine.
"""
from __future__ import annotations

import argparse
import html.parser
import json
import os
import pathlib
import platform
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

#: PyTorch's index of CPU-only builds.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The public index pip uses when nothing else is configured.
PUBLIC_INDEX = "https://pypi.org/simple"
#: Seconds to wait for an index before calling it unreachable.
TIMEOUT_S = 20

WHEEL_RE = re.compile(r"^torch-(?P<version>[^-]+)-(?P<py>cp\d+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


class _Links(html.parser.HTMLParser):
    """The file names an index page links to (PEP 503: one <a> per file)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href") or ""
            name = urllib.parse.unquote(href.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1])
            if name:
                self.names.append(name)


def listing(index: str) -> list[str] | None:
    """The file names on ``index``'s page for torch; None when the index cannot be read."""
    url = index.rstrip("/") + "/torch/"
    try:
        if url.startswith("file://"):
            path = pathlib.Path(urllib.parse.urlparse(url).path)
            page = path / "index.html"
            if not page.is_file():   # a plain directory of wheels (pip's --find-links form)
                return sorted(p.name for p in path.iterdir()) if path.is_dir() else None
            text = page.read_text()
        else:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
                text = resp.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, ValueError):
        return None
    parser = _Links()
    parser.feed(text)
    return parser.names


def machine_tags(py: str | None = None, arch: str | None = None) -> tuple[str, str]:
    """This interpreter's tag (cp311) and this machine's architecture (x86_64, aarch64)."""
    return (py or f"cp{sys.version_info.major}{sys.version_info.minor}",
            arch or platform.machine())


def fits(name: str, version: str, py: str, arch: str) -> str | None:
    """The wheel's full version (``2.13.0+cpu`` or ``2.13.0``) when ``name`` is torch
    ``version`` (any local label) for ``py`` on a Linux ``arch``; else None."""
    m = WHEEL_RE.match(name)
    if not m or m["py"] != py or not m["plat"].endswith(arch):
        return None
    if not (m["plat"].startswith("manylinux") or m["plat"].startswith("linux")):
        return None
    full = m["version"]
    return full if full.split("+", 1)[0] == version else None


def resolve(version: str, cpu: list[str] | None, public: list[str] | None,
            py: str, arch: str) -> dict:
    """Which torch to install: the CPU index's build of ``version`` if it has one for this
    machine, else the public index's, else a ValueError naming what is missing.

    ``cpu``/``public``: the file names each index lists for torch (None: unreachable).
    Returns ``requirement`` (for pip), ``source`` ("cpu-index" | "public") and ``why``.
    """
    for source, names in (("cpu-index", cpu), ("public", public)):
        found = sorted({v for n in names or [] if (v := fits(n, version, py, arch))})
        if not found:
            continue
        # On the CPU index prefer the +cpu label; the public index has the plain one.
        full = next((v for v in found if v.endswith("+cpu")), found[0])
        if source == "cpu-index":
            why = f"PyTorch's CPU build torch {full} from its CPU index"
        else:
            unreached = "unreachable" if cpu is None else f"has no {version} wheel for {py} {arch}"
            why = (f"the public build torch {full} (the CPU index is {unreached})"
                   + ("; on x86-64 it brings CUDA libraries" if arch == "x86_64" else ""))
        return {"requirement": f"torch=={full}", "source": source, "why": why}
    raise ValueError(f"no torch {version} wheel for {py} on {arch}: the CPU index is "
                     f"{'unreachable' if cpu is None else 'without one'}, the public index "
                     f"{'unreachable' if public is None else 'without one'}; use a machine with "
                     "Python 3.11 on x86-64 or aarch64, or set TORCH_VERSION to a version it has")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--version", required=True, help="torch version of the lock, e.g. 2.13.0")
    ap.add_argument("--cpu-index", default=os.environ.get("TORCH_CPU_INDEX", CPU_INDEX))
    ap.add_argument("--public-index", default=os.environ.get("PIP_INDEX_URL", PUBLIC_INDEX))
    ap.add_argument("--python-tag", default=None, help="default: this interpreter's")
    ap.add_argument("--arch", default=None, help="default: this machine's")
    a = ap.parse_args(argv)
    py, arch = machine_tags(a.python_tag, a.arch)
    cpu = listing(a.cpu_index)
    has_cpu_build = any(fits(n, a.version, py, arch) for n in cpu or [])
    public = None if has_cpu_build else listing(a.public_index)
    try:
        choice = resolve(a.version, cpu, public, py, arch)
    except ValueError as exc:
        print(f"setup: {exc}", file=sys.stderr)
        return 2
    choice["pip_args"] = ([choice["requirement"], "--extra-index-url", a.cpu_index]
                          if choice["source"] == "cpu-index" else [choice["requirement"]])
    print(json.dumps(choice))
    return 0


if __name__ == "__main__":
    sys.exit(main())
