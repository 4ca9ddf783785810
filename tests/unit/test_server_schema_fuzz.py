"""Schema fuzzing of every route: schemathesis generates requests from the app's own OpenAPI
document (/openapi.json), valid ones and ones that break the schema, and sends them in process
to the app over a FakeEngine (no model, no socket).

Checks on every answer: no 5xx; the status, content type and body are the ones the document
declares; and every rejection is in OpenAI's error format, exactly
{"error": {"message", "type", "param", "code"}}. Deterministic (derandomized) so that CI
does not flake; EAGLE_FUZZ_EXAMPLES raises the number of cases per operation and mode for a
deeper local run. The test prints one line of counts (cases, statuses, failures).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode

from server.app import create_app
from server.engine_client import EngineClient
from server.settings import ServerSettings

try:
    from tests.unit.test_server_fake_engine import FakeEngine
except ImportError:  # pytest's rootdir-relative import mode
    from test_server_fake_engine import FakeEngine

MAX_EXAMPLES = int(os.environ.get("EAGLE_FUZZ_EXAMPLES", "50"))
"""Cases per operation and generation mode."""

OPERATIONS = {
    "GET /debug/speculation",
    "GET /health",
    "GET /metrics",
    "GET /v1/models",
    "GET /v1/models/{model_id}",
    "POST /tokenize",
    "POST /v1/chat/completions",
    "POST /v1/completions",
}

SERVED = "fake-model"


def openai_error_format(ctx, response, case) -> None:
    """Every error answer is OpenAI's {"error": {"message", "type", "param", "code"}}, with
    exactly those keys (/health's 503 is its own documented {"status": ...})."""
    if response.status_code < 400:
        return None
    if case.operation.path == "/health" and response.status_code == 503:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"{response.status_code} with a body that is not JSON") from None
    assert isinstance(body, dict) and set(body) == {"error"}, f"not an OpenAI error: {body!r}"
    error = body["error"]
    assert isinstance(error, dict), f"not an OpenAI error: {body!r}"
    assert set(error) == {"message", "type", "param", "code"}, f"keys {sorted(error)}"
    assert isinstance(error["message"], str) and error["message"], "empty message"
    assert isinstance(error["type"], str) and error["type"], "empty type"
    assert error["param"] is None or isinstance(error["param"], str), "param"
    assert error["code"] is None or isinstance(error["code"], str), "code"
    return None


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    openai_error_format,
]


@dataclass
class Tally:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    per_operation: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def fuzz_schema():
    engine = FakeEngine(max_model_len=256)
    client = EngineClient(lambda: engine, max_waiting=16)
    app = create_app(client, ServerSettings(served_model_name=SERVED))
    # Loading the document starts the app's lifespan (schemathesis keeps it running), which
    # starts the engine client on schemathesis' event loop.
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    deadline = time.monotonic() + 10
    while client.state != "ready":
        assert time.monotonic() < deadline, f"engine not ready: {client.state}"
        time.sleep(0.01)
    yield schema
    client.shutdown()


def _fuzz(operation, mode: GenerationMode, tally: Tally) -> None:
    # Half the bodies name the served model, so that cases get past the model check (404)
    # to validation and generation, and half ask for a stream (chat and completions), which
    # random bodies seldom do.
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=operation.as_strategy(generation_mode=mode),
        served=st.booleans(),
        stream=st.booleans(),
    )
    def run(case, served: bool, stream: bool) -> None:
        if served and isinstance(case.body, dict):
            case.body["model"] = SERVED
        if stream and isinstance(case.body, dict) and "completions" in operation.path:
            case.body["stream"] = True
        response = case.call()
        tally.cases += 1
        tally.statuses[response.status_code] += 1
        tally.per_operation[operation.label] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as exc:
            tally.failures.append(f"{mode.value} {operation.label}: {exc}")

    run()


def test_every_route_fuzzed_from_the_openapi_document(fuzz_schema, capsys):
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    assert {op.label for op in operations} == OPERATIONS
    # The routes parse raw bodies: without their declared models there would be nothing to fuzz.
    assert all(op.body for op in operations if op.method.upper() == "POST")
    tally = Tally()
    started = time.perf_counter()
    for operation in operations:
        _fuzz(operation, GenerationMode.POSITIVE, tally)
        if operation.body:  # a GET's only parameter is a string path segment: nothing to break
            _fuzz(operation, GenerationMode.NEGATIVE, tally)
    seconds = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"\nschema fuzz: {tally.cases} cases over {len(operations)} operations in "
            f"{seconds:.1f}s, statuses {dict(sorted(tally.statuses.items()))}, "
            f"failures {len(tally.failures)}"
        )
    for operation in operations:  # every operation was exercised
        assert tally.per_operation[operation.label] > 0, operation.label
    assert not tally.failures, "\n\n".join(tally.failures[:5])
