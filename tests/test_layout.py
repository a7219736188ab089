"""The layout says where code runs: the client side imports nothing of the daemon's, and the
contract's public import paths keep working after the move. The test harness is testkit/, shared
with the benchmarks: the tests take it from there, not from benchmarks/, and the product never
imports it (nor is it installed)."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


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


ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("protocol", "telemetry", "trainer")
# The GPU benchmark's own measurement tools (percentiles, the sync window, the NVML and MFU
# comparisons), which test_gpu_bench_smoke.py runs on CPU to check the benchmark itself: they
# belong to the benchmark, not to the test harness.
TESTS_MAY_IMPORT_FROM_BENCHMARKS = {"test_gpu_bench_smoke.py": "benchmarks.gpu"}


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth of it (`from a import b` gives a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


def test_tests_import_their_harness_from_testkit_not_benchmarks():
    wrong = {}
    for f in sorted((ROOT / "tests").rglob("*.py")):
        allowed = TESTS_MAY_IMPORT_FROM_BENCHMARKS.get(f.name)
        bad = sorted(m for m in _imported_modules(f) if _top(m) == "benchmarks"
                     and not (allowed and (m == allowed or m.startswith(allowed + "."))))
        if bad:
            wrong[str(f.relative_to(ROOT))] = bad
    assert wrong == {}


def test_the_product_never_imports_testkit_or_benchmarks():
    wrong = {}
    for pkg in PRODUCT:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            bad = sorted(m for m in _imported_modules(f) if _top(m) in ("testkit", "benchmarks", "tests"))
            if bad:
                wrong[str(f.relative_to(ROOT))] = bad
    assert wrong == {}


def test_consumers_and_the_client_side_import_nothing_of_the_daemon_package():
    """Consumers attach from outside and read what the daemon wrote or publishes: they import
    protocol/ and telemetry/shared/, never telemetry.daemon (issue 28, item 4); nor do the
    client, the integrations or telemetry/shared itself, which the daemon imports."""
    wrong = {}
    for sub in ("consumers", "client", "integrations", "shared"):
        for f in sorted((ROOT / "telemetry" / sub).rglob("*.py")):
            bad = sorted(m for m in _imported_modules(f) if m == "telemetry.daemon" or m.startswith("telemetry.daemon."))
            if bad:
                wrong[str(f.relative_to(ROOT))] = bad
    assert wrong == {}


def test_the_daemon_builds_its_output_records_from_their_declaration():
    """Every record the daemon writes is one of protocol/output.py's Structs (issue 28 item 4):
    no dict literal with a "kind" key is left in the daemon package to build one beside them."""
    import ast

    wrong = []
    for f in sorted((ROOT / "telemetry" / "daemon").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "kind" for k in node.keys):
                wrong.append(f"{f.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []


def test_testkit_is_not_installed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = cfg["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(include) == sorted(f"{p}*" for p in PRODUCT)


def test_no_source_file_is_ignored_by_git():
    """A .gitignore rule for W&B's run directories (`wandb/`) once hid the `import wandb` package
    of `telemetry run --as-wandb`: every test passed here and the file never reached a clone. No
    source file of the product or the tests may be ignored."""
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--", *PRODUCT,
                          "testkit", "tests", "benchmarks", "launch"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    ignored = [p for p in out.stdout.splitlines() if p.endswith((".py", ".c", ".sh", ".js", ".html", ".yaml"))
               and "__pycache__" not in p]
    assert not ignored, f"source files git ignores (they would never reach a clone): {ignored}"
