"""The compiled parts, both optional: the daemon's C inner loops (telemetry/daemon/_hotpath.c)
and the client's C encode of a metrics record (protocol/_pack.c).

Everything else is in pyproject.toml. `optional=True`: where no C compiler is found the build
goes on without them; the daemon runs their Python twins (telemetry/daemon/loops.py; hotpath.py
picks) and the client encodes with msgpack (protocol/codec.py).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("telemetry.daemon._hotpath", ["telemetry/daemon/_hotpath.c"], optional=True),
                   Extension("protocol._pack", ["protocol/_pack.c"], optional=True)])
