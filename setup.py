"""The one compiled part: dblp._fastpath, the data path's per-datagram work in C.

Everything else is in pyproject.toml. The extension is optional: where it
cannot be built (no compiler, not Linux, a big-endian machine) the install
still succeeds and dblp.batch keeps its pure-Python path, which the tests
check it against bit for bit. Where OpenSSL's libcrypto and its headers are
installed (Debian: libssl-dev, which ./setup.sh installs) the core also
computes and checks the tags of a job with a secret; without them it is built
for jobs without one, and keyed jobs tag in Python.

In CI (``CI=true``) the core is built with warnings as errors and is not
optional, so a warning fails the build there instead of scrolling by (and a
failed build cannot fall back to the pure-Python path unnoticed).
"""
import os
import shutil
import subprocess
import sysconfig

from setuptools import Extension, setup

#: -ftree-vectorize: the receive side's chunk additions four floats at a time (take_run's
#: loop run alone: 8.4 -> 5.5 ms per 32 MiB on a 2-core VM). Element-wise, each sum rounded
#: alone, and no reduction is reordered without -ffast-math: bit for bit the pure-Python path.
COMPILE_ARGS = ["-O2", "-ftree-vectorize", "-fno-fast-math", "-ffp-contract=off"]
#: What CI adds: every warning gcc's -Wall and -Wextra know, as an error. The Python
#: C API's own idioms (an unused ``self``, PyModuleDef_HEAD_INIT's partial initializer)
#: are not ours to change.
STRICT_ARGS = ["-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
               "-Wno-missing-field-initializers", "-Wno-cast-function-type"]


def _header(*path: str) -> bool:
    """Whether a C header is in one of the usual include folders."""
    include = sysconfig.get_config_var("INCLUDEDIR") or "/usr/include"
    return any(os.path.exists(os.path.join(d, *path))
               for d in (include, "/usr/include", "/usr/local/include"))


def _libcrypto() -> bool:
    """Whether libcrypto's headers and library are here (pkg-config, else the usual paths)."""
    if shutil.which("pkg-config"):
        return subprocess.run(["pkg-config", "--exists", "libcrypto"]).returncode == 0
    return _header("openssl", "evp.h")


def _ipsec_mb() -> bool:
    """Whether Intel's Multi-Buffer Crypto library (Debian's libipsec-mb-dev, x86-64 only)
    is here: the C core then takes its AES-GMAC, four times libcrypto's speed per datagram."""
    return _header("intel-ipsec-mb.h")


def extension() -> Extension:
    args = list(COMPILE_ARGS)
    ci = os.environ.get("CI", "").lower() == "true"
    if ci:
        args += STRICT_ARGS
    crypto = _libcrypto()
    ipsec = crypto and _ipsec_mb()
    return Extension("dblp._fastpath", ["dblp/_fastpath.c"], optional=not ci,
                     extra_compile_args=args,
                     define_macros=([("DBLP_HAVE_LIBCRYPTO", "1")] if crypto else [])
                     + ([("DBLP_HAVE_IPSEC_MB", "1")] if ipsec else []),
                     libraries=(["crypto"] if crypto else []) + (["IPSec_MB"] if ipsec else []))


setup(ext_modules=[extension()])
