"""What the ranks said in their hellos, as the daemon keeps it.

A hello is input from the network: its info is redacted (secrets never reach a sink), held within
its share of the memory budget (memory.HelloInfos: cut, identical configs held once), kept for at
most MAX_WORLD_SIZE distinct ranks (a flood of hellos with made-up ranks must not grow memory or
make each hello cost the number before it), and the world size it claims believed only when sane.
"""
from __future__ import annotations

import logging
from typing import Any

from telemetry.daemon.aggregator import MAX_WORLD_SIZE
from telemetry.shared.numbers import is_int

log = logging.getLogger("telemetry.daemon")


class Hellos:
    """Each rank's latest hello info (`by_rank`), with the counts status and the daemon record give."""

    def __init__(self, infos: Any, redact: Any) -> None:
        self.by_rank: dict[int, dict] = {}
        self.num_in = 0                 # hellos taken in
        self.num_not_kept = 0           # hellos beyond MAX_WORLD_SIZE distinct ranks
        self._infos = infos             # memory.HelloInfos
        self._redact = redact           # security.redact.Redactor
        self._warned_world_size = False

    def take(self, rank: int, info: dict) -> dict:
        """The hello's info as kept (bounded, redacted): what its record carries."""
        info = self._redact(self._infos.keep(info))
        self.num_in += 1
        if rank in self.by_rank or len(self.by_rank) < MAX_WORLD_SIZE:
            self.by_rank[rank] = info
        else:
            self.num_not_kept += 1
        return info

    def world_size(self, rank: int, info: dict) -> int | None:
        """The world size the hello says, if it says one that can be believed (an int in
        1..MAX_WORLD_SIZE: it sizes per-rank structures and every step's missing_ranks); one
        that cannot is logged once and ignored."""
        ws = info.get("world_size")
        if ws is None:
            return None
        if is_int(ws) and 0 < ws <= MAX_WORLD_SIZE:
            return ws
        if not self._warned_world_size:
            self._warned_world_size = True
            log.warning("rank %d's hello says world_size=%r: not an integer in 1..%d, ignored (the "
                        "daemon waits for the ranks that said hello; set --world-size if that is wrong)",
                        rank, ws, MAX_WORLD_SIZE)
        return None
