"""The one compiled part: dblp._fastpath, the receive side's per-datagram work in C.

Everything else is in pyproject.toml. The extension is optional: where it
cannot be built (no compiler, not Linux, a big-endian machine) the install
still succeeds and dblp.batch keeps its pure-Python path, which the tests
check it against bit for bit.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("dblp._fastpath", ["dblp/_fastpath.c"], optional=True,
                             extra_compile_args=["-O2", "-fno-fast-math", "-ffp-contract=off"])])
