"""PollersConfig validation and the make_pollers factory."""
from __future__ import annotations

import pytest

from telemetry.daemon.pollers import PollersConfig, make_pollers
from telemetry.shared.config import ConfigError, build


def test_defaults():
    c = PollersConfig()
    assert c.nvml_interval_s == 1.0 and c.host_interval_s == 1.0 and c.nvml_enabled and c.host_enabled


@pytest.mark.parametrize("kw, fragment", [
    ({"nvml_interval_s": 0}, "nvml_interval_s"),
    ({"host_interval_s": -1.0}, "host_interval_s"),
    ({"host_interval_s": float("nan")}, "host_interval_s"),
    ({"host_interval_s": "1"}, "host_interval_s"),
    ({"nvml_enabled": "yes"}, "nvml_enabled"),
    ({"nvml_gpus": []}, "nvml_gpus"),
    ({"nvml_gpus": [0, -1]}, "nvml_gpus"),
    ({"nvml_gpus": "0,1"}, "nvml_gpus"),
    ({"host": ""}, "host"),
])
def test_bad_values_raise_config_error_naming_the_field(kw, fragment):
    """The `pollers:` mapping of a daemon config, through the project's one loader."""
    with pytest.raises(ConfigError, match=f"pollers.{fragment}"):
        build(PollersConfig, kw, "pollers")


def test_yaml_shapes_are_normalised():
    c = build(PollersConfig, {"nvml_interval_s": 2, "nvml_gpus": [0, 3]}, "pollers")
    assert c.nvml_interval_s == 2.0 and isinstance(c.nvml_interval_s, float) and c.nvml_gpus == (0, 3)


def test_unknown_keys_are_named():
    with pytest.raises(ConfigError, match="'pollers.nvml_intervl_s'"):
        build(PollersConfig, {"nvml_intervl_s": 1.0}, "pollers")
    assert build(PollersConfig, {}, "pollers") == PollersConfig()


def test_make_pollers_respects_enabled_flags():
    assert [p.name for p in make_pollers(PollersConfig())] == ["nvml", "host"]
    assert [p.name for p in make_pollers(PollersConfig(nvml_enabled=False))] == ["host"]
    assert make_pollers(PollersConfig(nvml_enabled=False, host_enabled=False)) == []
    p = make_pollers(PollersConfig(nvml_enabled=False, host_interval_s=5))[0]
    assert p.interval_s == 5.0
    p.close()
