"""Every error status of the real server process, as curl would meet it (tiny random model).

The tiny server requires an API key (given through EAGLE_SERVE_API_KEY), limits bodies to
4 KiB, runs one sequence with one waiting, and has the fault-injection hook for the 500 case.
After each error the server must keep serving.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.e2e.fault_injection import FAULT_MARKER, SECRET
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
def http(tiny_server: ServerProcess):
    with httpx.Client(base_url=tiny_server.url, headers=tiny_server.headers, timeout=60) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, param=None, code=None, type=None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    if type is not None:
        assert err["type"] == type
    return err


def assert_still_serving(http: httpx.Client) -> None:
    # Greedy and ignore_eos: a sampled end-of-sequence token must not make this flaky.
    body = {
        "model": "tiny",
        "prompt": "Hello",
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
    }
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 3


def test_happy_path_with_key(http):
    resp = http.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    )
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] <= 5


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "temperature": 9}, "temperature"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                  "n": 0}, "n"),
        ("/v1/chat/completions", {"model": "tiny"}, "messages"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]},
         "messages.0.role"),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 1.5}, "top_p"),
        ("/v1/completions", {"model": "tiny", "prompt": [1, 2, 999999]}, "prompt"),  # bad token id
    ],
)  # fmt: skip
def test_400_names_the_parameter(http, path, body, param):
    err = assert_error(http.post(path, json=body), 400, param=param, type="invalid_request_error")
    assert err["code"] == "invalid_value"
    assert_still_serving(http)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "tiny", "prompt": "hello " * 600}, "prompt"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hello " * 600}]},
         "messages"),
    ],
)  # fmt: skip
def test_400_context_length_exceeded(http, path, body, param):
    """OpenAI's code for a prompt that leaves no room in the context: clients act on it."""
    assert_error(http.post(path, json=body), 400, param=param, code="context_length_exceeded")
    assert_still_serving(http)


def test_400_for_broken_json(http):
    resp = http.post("/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                     headers={"Content-Type": "application/json"})  # fmt: skip
    assert_error(resp, 400)
    assert_still_serving(http)


def test_401_without_or_with_a_wrong_key(tiny_server: ServerProcess):
    body = {"model": "tiny", "prompt": "hi"}
    no_key = httpx.post(tiny_server.url + "/v1/completions", json=body)
    assert_error(no_key, 401, code="invalid_api_key", type="authentication_error")
    wrong = httpx.post(
        tiny_server.url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"}
    )
    assert_error(wrong, 401, code="invalid_api_key")
    models = httpx.get(tiny_server.url + "/v1/models")
    assert_error(models, 401)
    assert httpx.get(tiny_server.url + "/health").status_code == 200  # probes need no key
    assert httpx.get(tiny_server.url + "/metrics").status_code == 200


def test_404_unknown_model_and_route(http):
    resp = http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
    )
    assert_error(resp, 404, param="model", code="model_not_found")
    assert_error(http.get("/v1/engines"), 404)
    assert_still_serving(http)


def test_413_request_too_large(http):
    big = {"model": "tiny", "prompt": "x" * 10_000}
    assert_error(http.post("/v1/completions", json=big), 413, code="request_too_large")
    # Also without Content-Length (chunked upload): the limit holds while reading.
    resp = http.post("/v1/completions", content=iter([b"{" + b" " * 1000] * 10))
    assert_error(resp, 413)
    assert_still_serving(http)


def test_429_with_retry_after_before_any_stream(tiny_server: ServerProcess):
    """One sequence runs and one waits; a burst of streaming requests beyond that gets 429
    (a plain HTTP error, not an event inside a 200 stream) and the admitted ones complete."""
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 400,
            "ignore_eos": True, "stream": True}  # fmt: skip

    async def one(http: httpx.AsyncClient) -> tuple[int, str | None, bytes]:
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            data = await resp.aread()
            return resp.status_code, resp.headers.get("retry-after"), data

    async def burst():
        async with httpx.AsyncClient(
            base_url=tiny_server.url, headers=tiny_server.headers, timeout=120
        ) as http:
            return await asyncio.gather(*(one(http) for _ in range(12)))

    results = asyncio.run(burst())
    statuses = [status for status, _, _ in results]
    assert 429 in statuses and 200 in statuses, statuses
    for status, retry_after, data in results:
        if status == 429:
            assert retry_after is not None and int(retry_after) >= 1
            err = json.loads(data)["error"]
            assert err["code"] == "queue_full" and err["type"] == "rate_limit_error"
        else:
            assert status == 200
            assert data.rstrip().endswith(b"data: [DONE]")
    with httpx.Client(base_url=tiny_server.url, headers=tiny_server.headers, timeout=60) as http:
        assert_still_serving(http)


def test_500_without_internals(http, tiny_server: ServerProcess):
    resp = http.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": FAULT_MARKER}],
              "max_tokens": 4},
    )  # fmt: skip
    err = assert_error(resp, 500, code="internal_error", type="server_error")
    assert err["message"] == "Internal server error"
    for leak in ("secret", "Traceback", "0xdeadbeef", "RuntimeError"):
        assert leak not in resp.text
    assert SECRET in tiny_server.log_path.read_text()  # the operator still gets the details
    assert_still_serving(http)
    assert tiny_server.metric("eagle_num_requests_running") == 0
