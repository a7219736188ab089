"""Rules on the pollers' records: GPU throttling and host RAM."""
from __future__ import annotations

from telemetry.daemon.diagnosis.config import DiagnosisConfig
from telemetry.daemon.diagnosis.rules.base import Finding, Rule, finite, t_of


class Throttle(Rule):
    """A GPU with a thermal, HW-slowdown or power throttle flag in throttle_consecutive polls in a
    row; reported once per episode (an episode ends at the first poll without a flag)."""

    name = "throttle"
    kinds = frozenset({"gpu"})

    def __init__(self, cfg: DiagnosisConfig) -> None:
        super().__init__(cfg)
        self.num_polls: dict[tuple[str, int], int] = {}
        self.reported: set[tuple[str, int]] = set()

    def consume(self, record: dict) -> list[Finding]:
        values = record.get("values")
        key = (str(record.get("host")), record.get("gpu"))
        causes = []
        if finite(values, "gpu/throttle_thermal"):
            causes.append("thermal slowdown")
        if finite(values, "gpu/throttle_hw_slowdown"):
            causes.append("hardware slowdown")
        if self.cfg.throttle_include_power_cap and finite(values, "gpu/throttle_power"):
            causes.append("power cap")
        if not causes:
            self.num_polls.pop(key, None)
            self.reported.discard(key)
            return []
        n = self.num_polls[key] = self.num_polls.get(key, 0) + 1
        if n < self.cfg.throttle_consecutive or key in self.reported:
            return []
        self.reported.add(key)
        temp = finite(values, "gpu/temperature_c")
        power = finite(values, "gpu/power_w")
        limit = finite(values, "gpu/power_limit_w")
        sm = finite(values, "gpu/sm_clock_mhz")
        facts = []
        if temp is not None:
            facts.append(f"{temp:.0f} C")
        if power is not None:
            facts.append(f"{power:.0f} W" + (f" of a {limit:.0f} W limit" if limit else ""))
        if sm is not None:
            facts.append(f"SM clock {sm:.0f} MHz")
        msg = (f"GPU {key[1]} on {key[0]} is throttled ({', '.join(causes)}) for {n} polls in a row"
               + (f": {', '.join(facts)}" if facts else "")
               + "; its clocks are held down and every rank waits for it (check cooling, power limits)")
        return [Finding(f"{key[0]}/gpu{key[1]}", msg, t_of(record), data={
            "host": key[0], "gpu": key[1], "causes": ", ".join(causes), "num_polls": n,
            "temperature_c": temp, "power_w": power, "power_limit_w": limit, "sm_clock_mhz": sm})]


class HostMemory(Rule):
    """system/memory_percent at or above host_memory_percent_high."""

    name = "host_memory"
    kinds = frozenset({"system"})

    def consume(self, record: dict) -> list[Finding]:
        values = record.get("values")
        pct = finite(values, "system/memory_percent")
        if pct is None or pct < self.cfg.host_memory_percent_high:
            return []
        host = str(record.get("host"))
        swap = finite(values, "system/swap_percent")
        avail = finite(values, "system/memory_available_gb")
        rss = finite(values, "system/rss_gb")
        msg = (f"host RAM on {host} is {pct:.0f}% used"
               + (f" ({avail:.1f} GB available)" if avail is not None else "")
               + (f", swap {swap:.0f}% used" if swap is not None else "")
               + (f", training ranks hold {rss:.1f} GB resident" if rss is not None else "")
               + "; the kernel's OOM killer may end a rank (fewer DataLoader workers, memory-mapped "
                 "datasets, less pinned memory)")
        return [Finding(host, msg, t_of(record), severity="critical" if pct >= 97 else "warning", data={
            "host": host, "memory_percent": pct, "swap_percent": swap, "memory_available_gb": avail,
            "rss_gb": rss})]
