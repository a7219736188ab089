"""The daemon config: YAML with per-sink settings, validated; command-line flags override it."""
import pytest

from daemon_util import start_daemon
from telemetry.daemon.config import ConfigError, load


def test_yaml_per_sink_settings_and_overrides(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text("""
log_dir: from-yaml
jsonl: {fsync_interval_s: 0.5, rotate_mb: 64}
wandb: {mode: offline, every_n_steps: 10, max_per_second: 2, max_queued: 500}
pub_sink: {max_queued: 1000}
tensorboard: {enabled: true, every_n_steps: 5}
aggregator: {step_timeout_s: 3, per_rank: true, reductions: {"custom/*": sum}}
custom_sinks: [{class: "pkg.mod:MySink", options: {a: 1}, max_per_second: 1}]
""")
    cfg = load(p, {"wandb.mode": "disabled", "log_dir": str(tmp_path / "flag"), "aggregator.world_size": 4,
                   "run_name": None})
    assert cfg.log_dir == str(tmp_path / "flag") and cfg.wandb.mode == "disabled"       # flags win
    assert cfg.wandb.every_n_steps == 10 and cfg.wandb.max_per_second == 2.0 and cfg.wandb.max_queued == 500
    assert cfg.jsonl.rotate_mb == 64 and cfg.jsonl.fsync_interval_s == 0.5
    assert cfg.tensorboard.enabled and cfg.tensorboard.every_n_steps == 5
    assert cfg.aggregator.world_size == 4 and cfg.aggregator.per_rank and cfg.aggregator.step_timeout_s == 3
    (c,) = cfg.custom_sinks
    assert c.cls == "pkg.mod:MySink" and c.options == {"a": 1} and c.max_per_second == 1


@pytest.mark.parametrize("yaml_text, word", [
    ("wandb: {mode: sometimes}", "wandb.mode"),
    ("jsonl: {enabled: false}", "source of truth"),
    ("jsonl: {fsync_interval_s: 0}", "fsync_interval_s"),
    ("pub_sink: {every_n_steps: 0}", "every_n_steps"),
    ("aggregator: {step_timeout_s: -1}", "step_timeout_s"),
    ("nonsense_key: 1", "unknown config key 'nonsense_key'"),
    ("wandb: {max_queued: lots}", "wandb.max_queued"),
    ("custom_sinks: [{class: nocolon}]", "custom_sinks[0]"),
    ("[1, 2]", "mapping"),
])
def test_bad_config_is_a_clear_error(tmp_path, yaml_text, word):
    p = tmp_path / "d.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError, match=word.replace("[", r"\[").replace("]", r"\]")):
        load(p, {})


def test_daemon_refuses_a_bad_config_with_exit_2(tmp_path):
    with pytest.raises(RuntimeError, match="bad config"):
        start_daemon(tmp_path, config={"aggregator": {"step_timeout_s": -1}}, ready_timeout_s=180)


def test_daemon_uses_the_config_file(tmp_path):
    d = start_daemon(tmp_path, config={"aggregator": {"per_rank": True}, "tensorboard": {"enabled": True}})
    try:
        st = d.status()
        assert "tensorboard" in st["sinks"]
    finally:
        assert d.stop() == 0
        d.cleanup()


def test_every_section_is_typed_once_at_load(tmp_path):
    """The daemon config holds typed sections, not dicts parsed again where they are used."""
    from telemetry.daemon.diagnosis.config import DiagnosisConfig
    from telemetry.daemon.pollers.config import PollersConfig
    from telemetry.daemon.sinks.forward import ForwardConfig
    from telemetry.shared.security.curve import SecurityConfig

    p = tmp_path / "d.yaml"
    p.write_text("pollers: {nvml_gpus: [0, 1], host_interval_s: 2}\n"
                 "diagnosis: {disabled_rules: [throttle], min_interval_s: 5}\n"
                 "security: {curve_loopback: false}\n"
                 "forward: {endpoint: 'tcp://127.0.0.1:5557', kinds: [metrics]}\n")
    cfg = load(p, {"forward.node_rank": 2, "forward.num_nodes": 4, "aggregator.world_size": 8})
    assert isinstance(cfg.pollers, PollersConfig) and cfg.pollers.nvml_gpus == (0, 1)
    assert cfg.pollers.host_interval_s == 2.0 and isinstance(cfg.pollers.host_interval_s, float)
    assert isinstance(cfg.diagnosis, DiagnosisConfig) and cfg.diagnosis.disabled_rules == ("throttle",)
    assert isinstance(cfg.security, SecurityConfig) and not cfg.security.enabled
    assert isinstance(cfg.forward, ForwardConfig) and cfg.forward.node_rank == 2 and cfg.forward.kinds == ["metrics"]
    assert cfg.aggregator.first_rank == 16          # a node daemon waits for its own slice of the ranks
    plain = load(None, {})
    assert plain.forward is None and plain.pollers == PollersConfig() and plain.diagnosis == DiagnosisConfig()


def test_a_disabled_forward_section_starts_no_forwarder(tmp_path):
    """forward.enabled is read like every sink's `enabled` (it was a field nothing read)."""
    fwd = {"endpoint": "tcp://127.0.0.1:9", "enabled": False}
    d = start_daemon(tmp_path, config={"forward": fwd, "pollers": {"nvml_enabled": False, "host_enabled": False}})
    try:
        assert "forward" not in d.status()["sinks"]
    finally:
        assert d.stop() == 0
        d.cleanup()


def test_a_head_holds_a_connection_for_each_of_its_nodes(tmp_path):
    # Issue 33: 1,100 nodes on a head of the default 1,024 connections were refused 89,517 times.
    # A head (remote_ingest) whose world is 1,100 nodes holds two a node and its own, at least.
    cfg = load(None, {"log_dir": str(tmp_path / "t"), "remote_ingest": "tcp://127.0.0.1:5999",
                      "aggregator.world_size": 1100})
    assert cfg.max_connections == 2 * 1100 + 64
    bigger = load(None, {"log_dir": str(tmp_path / "t"), "remote_ingest": "tcp://127.0.0.1:5999",
                         "aggregator.world_size": 8, "max_connections": 5000})
    assert bigger.max_connections == 5000                  # a larger limit asked for stays
    rank_daemon = load(None, {"log_dir": str(tmp_path / "t"), "aggregator.world_size": 1100})
    assert rank_daemon.max_connections == 1024             # not a head: as configured
