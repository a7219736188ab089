"""Keep secrets out of what the daemon writes (metrics.jsonl, PUB, W&B config, daemon.log).

Ranks send their config in the hello record and free-form data in events. A config often
carries a W&B key, a hub token or a password; those values are replaced by "<redacted>" before
any sink sees the record:
  - any map entry whose key looks secret (api_key, token, password, secret, credential, ...);
  - any string equal to, or containing, the value of a secret-looking environment variable of
    the daemon (WANDB_API_KEY, HF_TOKEN, ...), wherever it appears.
"""
from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "<redacted>"
SECRET_KEY = re.compile(r"(api[_-]?key|token|passw(or)?d|secret|credential|private[_-]?key|auth[_-]?key"
                        r"|access[_-]?key)", re.IGNORECASE)
# Non-secret names that match the pattern above.
_NOT_SECRET = re.compile(r"^(num_|max_|min_)?tokens?(_per_.*|_count|s)?$|tokenizer", re.IGNORECASE)
MAX_DEPTH = 32
_MIN_SECRET_CHARS = 8     # shorter env values ("1", "true") would redact half the config


def is_secret_key(name: str) -> bool:
    return bool(SECRET_KEY.search(name)) and not _NOT_SECRET.search(name)


def env_secrets(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Values of this process's environment variables whose names look secret."""
    env = os.environ if environ is None else environ
    return tuple(sorted({v for k, v in env.items() if is_secret_key(k) and len(v) >= _MIN_SECRET_CHARS},
                        key=len, reverse=True))


class Redactor:
    def __init__(self, secrets: tuple[str, ...] | None = None) -> None:
        self.secrets = env_secrets() if secrets is None else secrets
        self.num_redacted = 0

    def __call__(self, obj: Any, depth: int = 0) -> Any:
        """A copy of `obj` with secret values replaced; `obj` itself is not changed."""
        if isinstance(obj, dict):
            if depth >= MAX_DEPTH:
                return obj
            out = {}
            for k, v in obj.items():
                if isinstance(k, str) and is_secret_key(k) and v not in (None, "", False):
                    out[k] = REDACTED
                    self.num_redacted += 1
                else:
                    out[k] = self(v, depth + 1)
            return out
        if isinstance(obj, list):
            return [self(v, depth + 1) for v in obj] if depth < MAX_DEPTH else obj
        if isinstance(obj, str) and self.secrets:
            for s in self.secrets:
                if s in obj:
                    obj = obj.replace(s, REDACTED)
                    self.num_redacted += 1
        return obj
