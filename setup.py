"""The compiled parts, all optional: the daemon's C inner loops (telemetry/daemon/_hotpath.c), the
client's C encode of a metrics record (protocol/_pack.c) and its log()'s common case
(telemetry/client/_fastlog.c, which shares that encode: protocol/_pack_frame.h).

Everything else is in pyproject.toml. `optional=True`: where no C compiler is found the build
goes on without them; the daemon runs their Python twins (telemetry/daemon/loops.py; hotpath.py
picks) and the client encodes with msgpack (protocol/codec.py) and logs in Python
(telemetry/client/fastlog.py).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("telemetry.daemon._hotpath", ["telemetry/daemon/_hotpath.c"], optional=True),
                   Extension("protocol._pack", ["protocol/_pack.c"], depends=["protocol/_pack_frame.h"], optional=True),
                   Extension("telemetry.client._fastlog", ["telemetry/client/_fastlog.c"],
                             depends=["protocol/_pack_frame.h"], optional=True)])
