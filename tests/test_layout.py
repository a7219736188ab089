"""The layout says where code runs: the client side imports nothing of the daemon's, and the
contract's public import paths keep working after the move."""
import subprocess
import sys


def test_public_import_paths():
    from telemetry import DisabledClient, TelemetryClient
    from telemetry.client import TelemetryClient as C
    from telemetry.daemon.sinks.base import Sink as DaemonSink
    from telemetry.integrations.hf import TelemetryCallback  # noqa: F401
    from telemetry.mfu import MfuEstimator, peak_flops, training_flops_per_token  # noqa: F401
    from telemetry.sinks.base import Sink

    assert TelemetryClient is C and issubclass(DisabledClient, TelemetryClient)
    assert Sink is DaemonSink
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12


def test_client_side_imports_nothing_of_the_daemon():
    code = ("import sys, telemetry; from telemetry import TelemetryClient; "
            "TelemetryClient(endpoint='', rank=0).close(); "
            "print(sorted(m for m in sys.modules if m.startswith(('telemetry.daemon', 'telemetry.consumers', "
            "'wandb', 'pynvml', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
