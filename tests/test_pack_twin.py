"""The client's C encode of a metrics record (protocol/_pack.c) writes msgpack's bytes, and
leaves every record it does not take (None) to the client's slow path: a value it does not
encode, or what the protocol refuses (a header int outside 0..2**63-1, a name of no characters or
more than MAX_NAME_CHARS), which the slow path counts instead of sending. Without the C part,
codec.checked_pack makes the same choice in Python.

The client's own log() goes through it (tests/test_client.py and the rest check what arrives);
here each record's bytes are compared with msgpack.Packer(use_bin_type=True)'s: random headers and
dicts of every plain value at every width boundary, then the values and dicts it hands back."""
from __future__ import annotations

import collections
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec
from protocol.constants import KIND_METRICS, MAX_NAME_CHARS, MAX_STEP, PROTOCOL_VERSION

ROOT = Path(__file__).resolve().parents[1]
pack = codec.pack_ints_map
native = pytest.mark.skipif(pack is None, reason="the client's C encode is not built here")


def msgpack_bytes(*frame):
    return msgpack.Packer(use_bin_type=True).pack(frame)


def test_it_is_built_where_there_is_a_compiler():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the client encodes with msgpack")
    assert pack is not None


def test_telemetry_pure_python_turns_it_off_and_the_client_still_sends():
    code = ("from protocol import codec; import msgpack\n"
            "from telemetry.client.core import TelemetryClient\n"
            "print(codec.pack_ints_map is None)\n"
            "c = TelemetryClient('ipc:///nonexistent/x', rank=0, send_hello=False)\n"
            "c.log(1, {'a': 1.0}); print(c.stats()['seq']); c.close(timeout_s=0)\n")
    env = {**os.environ, "TELEMETRY_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "1"]


# Every boundary of msgpack's integer forms, on both sides.
EDGES = [0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
         -1, -31, -32, -33, -127, -128, -129, -32767, -32768, -32769, -2**31, -2**31 - 1, -2**63 + 1, -2**63]
ints = st.one_of(st.sampled_from(EDGES), st.integers(-2**63, 2**64 - 1))
plain = st.one_of(st.floats(allow_nan=True, allow_infinity=True), ints, st.booleans(), st.none())
keys = st.one_of(st.text(max_size=40), st.text(min_size=30, max_size=300),
                 st.sampled_from(["", "a" * 31, "a" * 32, "é" * 16, "a" * 255, "a" * 256, "train/loss"]))


@native
@settings(max_examples=600, deadline=None)
@given(st.lists(ints, min_size=0, max_size=13), st.dictionaries(keys, plain, max_size=40))
def test_its_bytes_are_msgpacks(header, values):
    takes = all(0 <= h <= MAX_STEP for h in header) and all(0 < len(k) <= MAX_NAME_CHARS for k in values)
    assert pack(*header, values) == (msgpack_bytes(*header, values) if takes else None)


@settings(max_examples=600, deadline=None)
@given(st.lists(ints, min_size=0, max_size=13), st.dictionaries(keys, plain, max_size=40))
def test_the_python_twin_takes_the_same_records(header, values):
    # Without the C part (no compiler, TELEMETRY_PURE_PYTHON): the same records taken, the same bytes.
    takes = all(0 <= h <= MAX_STEP for h in header) and all(0 < len(k) <= MAX_NAME_CHARS for k in values)
    out = codec.checked_pack(msgpack.Packer(use_bin_type=True))(*header, values)
    assert out == (msgpack_bytes(*header, values) if takes else None)


@native
def test_what_the_protocol_refuses_goes_to_the_slow_path():
    """A record the daemon would refuse whole (a negative or too large step or header int) or in
    part (a name of 0 or more than MAX_NAME_CHARS characters) is not encoded: the client's slow
    path counts it (stats' dropped, skipped_values) and says so, where it was sent and refused."""
    from protocol import _pack

    assert _pack.MAX_NAME_CHARS == MAX_NAME_CHARS
    for header in ((-1,), (1, -5), (MAX_STEP + 1,), (2**64 - 1,)):
        assert pack(*header, {"a": 1.0}) is None, header
    assert pack(MAX_STEP, {"a": 1.0}) == msgpack_bytes(MAX_STEP, {"a": 1.0})
    for name in ("", "a" * (MAX_NAME_CHARS + 1), "é" * (MAX_NAME_CHARS + 1)):
        assert pack(1, {"ok": 1.0, name: 1.0}) is None, len(name)
    for name in ("a" * MAX_NAME_CHARS, "é" * MAX_NAME_CHARS):       # characters, not bytes
        assert pack(1, {name: 1.0}) == msgpack_bytes(1, {name: 1.0})


@native
def test_a_client_record_and_its_widths():
    t = 1_790_000_000_123_456_789
    for n in (0, 1, 15, 16, 17, 300, 4096, 65535):   # past the stack's buffer, too
        values = {f"train/metric_{i}": i * 0.5 - 7 for i in range(n)}
        frame = (KIND_METRICS, PROTOCOL_VERSION, 2**63 - 5, 3, 123456, 7, t, 10_000, values)
        out = pack(*frame)
        assert out == msgpack_bytes(*frame), n
    # Signed zero, NaN's payload and infinities go through as their bits.
    values = {"z": -0.0, "n": float("nan"), "i": -math.inf, "big": 1e308, "tiny": 5e-324}
    assert pack(1, values) == msgpack_bytes(1, values)


@native
def test_int_and_float_subclasses_are_taken_as_msgpack_takes_them():
    import enum

    class Level(enum.IntEnum):
        HIGH = 300

    class F(float):
        pass

    np = pytest.importorskip("numpy")
    values = {"level": Level.HIGH, "f": F(2.5), "np64": np.float64(0.25)}
    assert pack(1, values) == msgpack_bytes(1, values)


@native
@pytest.mark.parametrize("values", [
    {"s": "text"}, {"b": b"x"}, {"l": [1.0]}, {"d": {"a": 1.0}}, {"big": 2**64}, {"neg": -2**63 - 1},
    {1: 1.0}, {("t",): 1.0}, {"\ud800": 1.0}, {"c": 1j},
], ids=lambda v: repr(next(iter(v))))
def test_values_and_keys_it_does_not_take_go_back_to_msgpack(values):
    assert pack(1, 2, values) is None


@native
def test_numpy_and_torch_scalars_go_back_to_msgpack():
    np = pytest.importorskip("numpy")
    assert pack(1, {"x": np.float32(1.5)}) is None
    assert pack(1, {"x": np.int64(3)}) is None
    torch = pytest.importorskip("torch")
    assert pack(1, {"x": torch.tensor(1.5)}) is None


@native
def test_other_mappings_and_odd_headers_go_back_to_msgpack():
    assert pack(1, collections.OrderedDict(a=1.0)) is None
    assert pack(1, collections.defaultdict(float, a=1.0)) is None
    assert pack(1, [1.0]) is None
    assert pack(True, {"a": 1.0}) is None           # msgpack writes True, not 1
    assert pack(1.0, {"a": 1.0}) is None
    assert pack(2**64, {"a": 1.0}) is None
    assert pack(-1, {"a": 1.0}) is None
    assert pack(1, {f"k{i}": 1.0 for i in range(65536)}) is None     # map32: msgpack's


@native
def test_it_refuses_a_call_without_a_dict_or_with_too_many_ints():
    with pytest.raises(TypeError):
        pack()
    with pytest.raises(TypeError):
        pack(*range(15), {})
