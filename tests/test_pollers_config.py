"""PollersConfig validation and the make_pollers factory."""
from __future__ import annotations

import pytest

from telemetry.pollers import PollersConfig, make_pollers


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
def test_bad_values_raise_value_error_naming_the_field(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        PollersConfig(**kw)


def test_yaml_shapes_are_normalised():
    c = PollersConfig(nvml_interval_s=2, nvml_gpus=[0, 3])
    assert c.nvml_interval_s == 2.0 and isinstance(c.nvml_interval_s, float) and c.nvml_gpus == (0, 3)


def test_from_dict_names_unknown_keys():
    with pytest.raises(ValueError, match="nvml_intervl_s"):
        PollersConfig.from_dict({"nvml_intervl_s": 1.0})
    assert PollersConfig.from_dict(None) == PollersConfig()


def test_make_pollers_respects_enabled_flags():
    assert [p.name for p in make_pollers(PollersConfig())] == ["nvml", "host"]
    assert [p.name for p in make_pollers(PollersConfig(nvml_enabled=False))] == ["host"]
    assert make_pollers(PollersConfig(nvml_enabled=False, host_enabled=False)) == []
    p = make_pollers(PollersConfig(nvml_enabled=False, host_interval_s=5))[0]
    assert p.interval_s == 5.0
    p.close()
