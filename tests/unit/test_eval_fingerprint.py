"""The evaluation stage reuses a cached result only for the same head weights and settings."""

from __future__ import annotations

import json

from eagle_core.train.evaluate import _cached, fingerprint, weights_digest


def test_fingerprint_follows_weights_and_settings(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes(b"weights v1")
    settings = {"set": "mtbench_T0", "max_tokens": 96}
    first = fingerprint(weights_digest(str(head)), settings)
    assert fingerprint(weights_digest(str(head)), dict(settings)) == first
    assert fingerprint(weights_digest(str(head)), {**settings, "max_tokens": 128}) != first

    result = tmp_path / "mtbench_T0.json"
    result.write_text(json.dumps({"tau": 2.0, "fingerprint": first}))
    assert _cached(str(result), first)["tau"] == 2.0

    # retrained into the same directory: the old figure must not be reused
    (head / "model.safetensors").write_bytes(b"weights v2")
    assert _cached(str(result), fingerprint(weights_digest(str(head)), settings)) is None
    # results written before fingerprints existed are recomputed too
    result.write_text(json.dumps({"tau": 2.0}))
    assert _cached(str(result), first) is None
    assert _cached(str(tmp_path / "missing.json"), first) is None
