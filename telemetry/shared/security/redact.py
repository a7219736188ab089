"""Keep secrets out of what the daemon writes (metrics.jsonl, PUB, W&B config, daemon.log).

Ranks send their config in the hello record and free-form data in events. A config often
carries a W&B key, a hub token or a password; those values are replaced by "<redacted>" before
the record leaves the rank (TelemetryClient.hello/event) and again before any sink of the daemon
sees it (the daemon's hello and event path), both with this one Redactor:
  - the value of a map entry whose key names a secret, matched by whole words of the key
    (`hf_token`, `token`, `api_key`, `apikey`, `password`, `passwd`, `db_pwd`, `secret`,
    `private_key`, `access_key`, `auth`, `credentials`; not `bos_token_id`, `max_tokens`,
    `token_type`, `tokenizer`, `pad_token`): a string is replaced, a map or a list has its
    strings replaced; numbers and booleans are never secrets and are kept;
  - `key` under a service's map (`wandb: {key: ...}`, `hf: {key: ...}`);
  - the password of a URL anywhere in a string (`postgres://admin:<redacted>@db:5432/x`);
  - inside a string, the value of a secret-named `name=value` or `name: value` (a URL's query,
    `--api-key=...`, a DSN's `password=...`, `Authorization: Bearer ...`), and well-known token
    shapes (hf_, ghp_, github_pat_, glpat-, sk-, AKIA/ASIA, xox?-, `Bearer ...`);
  - in a list (a command line), the item after a flag that names a secret (`--hf_token X`);
  - any string equal to, or containing, the value of a secret-looking environment variable of
    the process (WANDB_API_KEY, HF_TOKEN, ...), wherever it appears.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any

REDACTED = "<redacted>"
MAX_DEPTH = 32            # deeper maps and lists are replaced whole: nothing unlooked-at goes out
_MIN_SECRET_CHARS = 8     # shorter env values ("1", "true") would redact half the config

# Words of a key: snake_case, kebab-case, dotted and camelCase ("apiKey", "HFToken") alike.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# A word holding one of these is a secret's name wherever it stands (dbpassword, client_secret).
_SECRET_PARTS = ("passw", "secret", "credential", "passphrase", "apikey", "privatekey", "accesskey", "authkey")
# `<one of these>_key` (api_key, aws_access_key_id, wandb_key) is a key in the secret sense.
_KEY_QUALIFIERS = frozenset({"api", "private", "access", "auth", "signing", "encryption", "ssh", "license",
                             "wandb", "hf", "openai", "anthropic", "aws", "hmac", "session", "master"})
# A map whose own key names a service: its `key` entry is the service's key (wandb: {key: ...}).
_SERVICES = frozenset({"wandb", "hf", "huggingface", "hub", "openai", "anthropic", "aws", "s3", "api",
                       "comet", "neptune", "mlflow", "github"})
# `<one of these>_token` is a tokenizer's special token ("<pad>", "</s>"), not a credential.
_SPECIAL_TOKENS = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "sos", "start", "end", "begin",
                             "image", "audio", "video", "vision", "boi", "eoi", "eot", "eom", "fim", "special"})
# `<one of these>_tokens` is a list of credentials (api_tokens), not a count (max_tokens).
_TOKEN_QUALIFIERS = frozenset({"api", "auth", "access", "refresh", "bearer", "hf", "hub", "wandb", "github",
                               "session", "secret"})
_AUTH_WORDS = frozenset({"auth", "oauth", "authorization", "bearer", "jwt", "cookie", "cookies", "signature"})
# `pass` and `pw` name a password alone or after one of these (db_pass, user_pw); never
# forward_pass, num_pass.
_PASS_WORDS = frozenset({"pass", "pw"})
_PASS_QUALIFIERS = frozenset({"db", "user", "admin", "root", "login", "smtp", "ftp", "mysql", "postgres", "pg",
                              "redis", "mongo", "basic", "sudo", "ssh", "proxy", "mail", "email", "account"})
# scheme://user:PASSWORD@host: the password runs to the authority's last "@". A scheme starts
# only where no scheme character precedes it: otherwise each letter of a long word would start
# a scan to its end (quadratic: a 1 MiB event string would hold the daemon's loop for minutes).
_URL_PASSWORD = re.compile(r"(?<![A-Za-z0-9+.\-])([A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:)([^\s/?#]+)@")
_MAX_CACHED_KEY = 128
# name=value or name: value inside a string (a URL's query, a command line's --flag=value, a
# libpq DSN, a log line): the value is redacted when the name is a secret's (a scheme's "://"
# is no separator). Names start only after a character that is no letter, digit or "_" and are
# at most 64 characters: one linear pass.
_NAMED_VALUE = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z][A-Za-z0-9_.\-]{0,63})(=|:(?!//)[ \t]*)((?:(?i:bearer|basic|digest|token)[ \t]+)?[^\s&;,'\"<>#?]+)")
# Credentials recognisable by their shape wherever they stand: an HTTP authorization value, and
# the prefixed tokens of the hubs and clouds a training job talks to (Hugging Face, GitHub,
# GitLab, OpenAI/Anthropic, AWS access key ids, Slack).
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_\-])(?:(?i:bearer)[ \t]+[A-Za-z0-9._~+/=\-]{8,}"
    r"|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_\-]{16,}"
    r"|sk-[A-Za-z0-9_\-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9\-]{10,})")


def _words(name: str) -> tuple[str, ...]:
    return tuple(w.lower() for w in _WORD.findall(name))


def _secret_words(words: tuple[str, ...]) -> bool:
    if not words:
        return False
    last = words[-1]
    prev = words[-2] if len(words) > 1 else ""
    if any(part in w for w in words for part in _SECRET_PARTS):
        return True
    if last in _AUTH_WORDS or (last == "pwd" and prev):
        return True
    if last in _PASS_WORDS and (not prev or prev in _PASS_QUALIFIERS):
        return True
    if last.endswith("token"):       # token, hf_token, accesstoken; never token_id, token_type
        return prev not in _SPECIAL_TOKENS
    if last == "tokens":             # api_tokens; never max_tokens, num_input_tokens
        return prev in _TOKEN_QUALIFIERS
    return any(w == "key" and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words) if i)


@functools.lru_cache(maxsize=4096)
def _cached(name: str) -> bool:
    return _secret_words(_words(name))


def is_secret_key(name: str) -> bool:
    """Whether a map key (or an environment variable's name) names a secret, by its whole words."""
    # Only short names are cached: the keys come from the wire, the cache must stay small.
    return _cached(name) if len(name) <= _MAX_CACHED_KEY else _secret_words(_words(name))


def _is_service(name: Any) -> bool:
    return isinstance(name, str) and not _SERVICES.isdisjoint(_words(name[:_MAX_CACHED_KEY]))


def env_secrets(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Values of this process's environment variables whose names look secret."""
    env = os.environ if environ is None else environ
    return tuple(sorted({v for k, v in env.items() if is_secret_key(k) and len(v) >= _MIN_SECRET_CHARS},
                        key=len, reverse=True))


class Redactor:
    def __init__(self, secrets: tuple[str, ...] | None = None) -> None:
        self.secrets = env_secrets() if secrets is None else secrets
        self.num_redacted = 0

    def __call__(self, obj: Any) -> Any:
        """A copy of `obj` with secret values replaced; `obj` itself is not changed."""
        return self._walk(obj, 0, None, False)

    def _walk(self, obj: Any, depth: int, parent: Any, secret: bool) -> Any:
        # Numbers, booleans and None are never secrets (a token id, a flag): kept as they are.
        if obj is None or isinstance(obj, (bool, int, float)):
            return obj
        if isinstance(obj, dict):
            if depth >= MAX_DEPTH:
                return self._replaced()
            out = {}
            for k, v in obj.items():
                is_secret = secret or (isinstance(k, str) and (
                    is_secret_key(k) or (k.lower() == "key" and _is_service(parent))))
                out[k] = self._walk(v, depth + 1, k, is_secret)
            return out
        if isinstance(obj, (list, tuple)):
            if depth >= MAX_DEPTH:
                return self._replaced()
            return self._walk_list(obj, depth, parent, secret)
        if secret:
            return obj if obj == "" else self._replaced()
        if isinstance(obj, str):
            for s in self.secrets:
                if s in obj:
                    obj = obj.replace(s, REDACTED)
                    self.num_redacted += 1
            if "://" in obj and "@" in obj:
                obj, n = _URL_PASSWORD.subn(r"\1" + REDACTED + "@", obj)
                self.num_redacted += n
            if "=" in obj or ":" in obj:
                obj, n = _NAMED_VALUE.subn(self._named_value, obj)
                self.num_redacted += n
            obj, n = _TOKEN_SHAPES.subn(self._token_shape, obj)
            self.num_redacted += n
        return obj

    @staticmethod
    def _named_value(m: re.Match) -> str:
        name = m.group(1).strip(".-")
        if m.group(3) == REDACTED or not is_secret_key(name):
            return m.group(0)
        return m.group(1) + m.group(2) + REDACTED

    @staticmethod
    def _token_shape(m: re.Match) -> str:
        word, sep, _ = m.group(0).partition(" ")
        return word + " " + REDACTED if sep else REDACTED

    def _walk_list(self, items, depth: int, parent: Any, secret: bool) -> list:
        """A list's items; in a command line (["--hf-token", "hf_...", ...]) the item after a
        flag that names a secret is that secret."""
        out, after_flag = [], False
        for v in items:
            if after_flag and isinstance(v, str) and not v.startswith("-"):
                out.append(self._replaced())
            else:
                out.append(self._walk(v, depth + 1, parent, secret))
            after_flag = isinstance(v, str) and v.startswith("-") and "=" not in v \
                and len(v) <= _MAX_CACHED_KEY and is_secret_key(v.lstrip("-"))
        return out

    def _replaced(self) -> str:
        self.num_redacted += 1
        return REDACTED
