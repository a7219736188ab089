"""Public path of the analytic FLOPs and MFU maths (the contract's `telemetry.mfu`); the code
lives with the daemon that uses it, in telemetry/daemon/mfu.py and telemetry/daemon/peaks.py."""
from telemetry.daemon.mfu import *  # noqa: F401,F403
from telemetry.daemon.mfu import __all__  # noqa: F401
