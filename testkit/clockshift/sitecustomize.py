"""A process whose wall clock is off (tests of a node whose clock is minutes off): with this
directory on PYTHONPATH and TESTKIT_CLOCK_OFFSET_S set, time.time and time.time_ns read that many
seconds ahead (negative: behind). The monotonic clocks are left alone, as a real wrong clock does."""
import os
import time

_offset_s = float(os.environ.get("TESTKIT_CLOCK_OFFSET_S") or 0)
if _offset_s:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _offset_s
    time.time_ns = lambda: _time_ns() + int(_offset_s * 1e9)
