"""The one compiled part: the daemon's optional C inner loops (telemetry/daemon/_hotpath.c).

Everything else is in pyproject.toml. `optional=True`: where no C compiler is found the build
goes on without it and the daemon runs their Python twins (telemetry/daemon/loops.py; hotpath.py picks).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("telemetry.daemon._hotpath", ["telemetry/daemon/_hotpath.c"], optional=True)])
