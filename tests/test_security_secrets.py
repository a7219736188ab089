"""Secrets never appear in anything the daemon writes: JSONL, daemon.log, status, W&B files."""
from __future__ import annotations

import json
import os

from telemetry.client import TelemetryClient
from telemetry.shared.security.redact import REDACTED, Redactor, is_secret_key

WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"
HF_TOKEN = "hf_SeCrEtToKeNvAlUe12345"
PASSWORD = "hunter2-correct-horse"


def test_redactor_rules():
    r = Redactor(secrets=(WANDB_KEY,))
    out = r({"api_key": "x", "lr": 0.1, "num_tokens": 5, "tokenizer": "gpt2", "nested": {"hf_token": "y"},
             "list": [{"password": "z"}], "note": f"key={WANDB_KEY}!", "token": None})
    assert out == {"api_key": REDACTED, "lr": 0.1, "num_tokens": 5, "tokenizer": "gpt2",
                   "nested": {"hf_token": REDACTED}, "list": [{"password": REDACTED}],
                   "note": f"key={REDACTED}!", "token": None}
    assert all(is_secret_key(k) for k in ("WANDB_API_KEY", "HF_TOKEN", "db_password", "aws_secret_access_key"))
    assert not any(is_secret_key(k) for k in ("tokens_per_second", "num_tokens", "max_tokens", "tokenizer_name"))


def test_no_secret_reaches_any_output(make_daemon, tmp_path):
    d = make_daemon(wandb="offline", world_size=1, env={"WANDB_API_KEY": WANDB_KEY, "HF_TOKEN": HF_TOKEN})
    tm = TelemetryClient(d.ingest, rank=0)
    tm.hello({"config": {"lr": 3e-4, "wandb": {"api_key": WANDB_KEY, "project": "p"}, "hf_token": HF_TOKEN,
                         "db": {"password": PASSWORD}, "note": f"launched with WANDB_API_KEY={WANDB_KEY}"}})
    tm.event("login", {"secret": PASSWORD, "msg": f"token {HF_TOKEN} used"})
    tm.log(1, {"train/loss": 1.0})
    tm.close()
    d.wait_for(lambda recs: any(r.get("kind") == "event" for r in recs) and any(r.get("step") == 1 for r in recs))
    status = json.dumps(d.status())
    final = json.dumps(d.drain())
    hello = [r for r in d.read_jsonl("hello") if r["rank"] == 0][-1]
    assert hello["info"]["config"]["wandb"]["api_key"] == REDACTED
    assert hello["info"]["config"]["lr"] == 3e-4          # everything else is kept
    assert json.loads(final)["security"]["redacted"] >= 5
    texts = {"stdout": d.output(), "status": status, "final": final}
    for root, _, files in os.walk(tmp_path):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                texts[path] = f.read().decode("utf-8", "replace")
    assert any(p.endswith("metrics.jsonl") for p in texts) and any(p.endswith("daemon.log") for p in texts)
    assert any("wandb" in p for p in texts), "the W&B sink wrote nothing: the test would prove little"
    for secret in (WANDB_KEY, HF_TOKEN, PASSWORD):
        leaks = [p for p, t in texts.items() if secret in t]
        assert not leaks, f"{secret[:6]}... found in {leaks}"
