"""Engine client and SSE over a real socket (uvicorn in process, FakeEngine): batching,
client disconnects abort engine requests, one engine thread, the shutdown drain."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest
import uvicorn

from eagle_core.errors import InvalidRequestError
from eagle_core.sampling_params import SamplingParams
from server.app import create_app
from server.engine_client import EngineClient
from server.settings import ServerSettings

try:
    from tests.unit.test_server_fake_engine import FakeEngine
except ImportError:  # pytest's rootdir-relative import mode
    from test_server_fake_engine import FakeEngine


@contextlib.asynccontextmanager
async def live_server(engine: FakeEngine, max_waiting: int = 64, shutdown_timeout_s: float = 30.0):
    """Yields (engine client, HTTP client, the app's Drain)."""
    client = EngineClient(lambda: engine, max_waiting=max_waiting)
    settings = ServerSettings(served_model_name="fake-model", shutdown_timeout_s=shutdown_timeout_s)
    app = create_app(client, settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    await client.wait_ready()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield client, http, app.state.drain
    finally:
        server.should_exit = True
        await task


async def wait_until(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_stream_disconnect_aborts_the_request():
    engine = FakeEngine(max_model_len=100_000)
    engine.step_delay = 0.005
    async with live_server(engine) as (client, http, _):
        body = {"prompt": "p", "max_tokens": None, "temperature": 1.0, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            seen = 0
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 3:
                        break
        await wait_until(lambda: engine.aborted)
        await wait_until(lambda: client.num_running == 0 and not engine.has_unfinished())
        assert engine.aborted == [engine.added[0]]
        resp = await http.post("/v1/completions", json={"prompt": "p", "temperature": 0})
        assert resp.json()["choices"][0]["text"] == FakeEngine.REPLY[:16]


async def test_non_stream_disconnect_aborts_the_request():
    engine = FakeEngine(max_model_len=100_000)
    engine.step_delay = 0.005
    async with live_server(engine) as (client, http, _):
        body = {"prompt": "p", "max_tokens": None, "temperature": 1.0}
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/completions", json=body, timeout=0.3)
        await wait_until(lambda: engine.aborted, timeout=5)
        await wait_until(lambda: client.num_running == 0)


async def test_concurrent_streams_are_batched_and_complete():
    engine = FakeEngine(max_num_seqs=32)
    engine.step_delay = 0.002
    async with live_server(engine) as (client, http, _):

        async def one(i: int) -> str:
            body = {
                "messages": [{"role": "user", "content": f"q{i}"}],
                "temperature": 0,
                "stream": True,
            }
            text = ""
            async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        text += delta.get("content") or ""
            return text

        texts = await asyncio.gather(*(one(i) for i in range(32)))
        assert texts == [FakeEngine.REPLY] * 32
        assert client.peak_running > 1
        assert engine.peak_running > 1
        assert engine.used_threads == 1
        metrics = (await http.get("/metrics")).text
        peak = [
            ln for ln in metrics.splitlines() if ln.startswith("eagle_num_requests_running_peak")
        ]
        assert float(peak[0].split()[-1]) > 1


async def test_submit_is_all_or_nothing_on_invalid_request():
    engine = FakeEngine(max_model_len=10)
    client = EngineClient(lambda: engine, max_waiting=8)
    client.start()
    await client.wait_ready()
    try:
        params = [SamplingParams(max_tokens=2)] * 2
        with pytest.raises(InvalidRequestError) as info:
            await client.submit("r", ["ok", "x" * 50], params)
        assert info.value.param == "prompt"
        await wait_until(lambda: not engine.has_unfinished())
        assert engine.aborted == ["r-0"]
        stream = await client.submit("s", ["ok"], [SamplingParams(max_tokens=2)])
        outs = [out async for _, out in stream]
        assert outs[-1].finished and outs[-1].finish_reason == "length"
    finally:
        client.shutdown()


async def test_a_draining_server_finishes_what_it_can_and_cuts_the_rest_explicitly(caplog):
    """SIGTERM (the app's Drain): new requests get 503 server_shutdown; requests that end within
    the timeout end normally; at the deadline a stream still running gets a server_shutdown
    error event and [DONE], a non-streamed request a 503 server_shutdown body; one log line."""
    engine = FakeEngine(max_model_len=100_000)
    engine.step_delay = 0.05  # 2 characters per step: the greedy reply (51) takes ~1.3 s
    timeout = 2.5

    async def read(http, body, started: asyncio.Event) -> list[str]:
        data = []
        async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    data.append(line[6:])
                    started.set()
        return data

    greedy = {"prompt": "p", "temperature": 0, "max_tokens": None}
    endless = {"prompt": "p", "max_tokens": None, "temperature": 1.0}
    async with live_server(engine, shutdown_timeout_s=timeout) as (client, http, drain):
        starts = [asyncio.Event(), asyncio.Event()]
        short_stream = asyncio.create_task(read(http, greedy, starts[0]))
        long_stream = asyncio.create_task(read(http, endless, starts[1]))
        short_plain = asyncio.create_task(http.post("/v1/completions", json={**greedy, "max_tokens": 10}))
        long_plain = asyncio.create_task(http.post("/v1/completions", json=endless))
        for started in starts:
            await asyncio.wait_for(started.wait(), 5)
        await wait_until(lambda: client.num_running == 4)
        caplog.set_level("INFO", logger="server.shutdown")
        t0 = asyncio.get_running_loop().time()
        draining = asyncio.create_task(drain.run())
        await wait_until(lambda: drain.stopping)
        refused = await http.post("/v1/completions", json=greedy)
        health = await http.get("/health")
        await asyncio.wait_for(draining, timeout + 3)
        elapsed = asyncio.get_running_loop().time() - t0
        results = await asyncio.gather(short_stream, long_stream, short_plain, long_plain)
        await wait_until(lambda: not engine.has_unfinished())  # the cut requests left the engine
    short_data, long_data, short_resp, long_resp = results
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutdown"
    assert refused.json()["error"]["type"] == "service_unavailable_error"
    assert health.status_code == 503 and health.json()["status"] == "stopping"
    assert short_data[-1] == "[DONE]"
    assert json.loads(short_data[-2])["choices"][0]["finish_reason"] == "stop"
    assert short_resp.status_code == 200
    assert short_resp.json()["choices"][0]["text"] == FakeEngine.REPLY[:10]
    assert long_data[-1] == "[DONE]"
    assert json.loads(long_data[-2])["error"]["code"] == "server_shutdown"
    assert len(long_data) > 30  # it went on streaming until the deadline
    assert long_resp.status_code == 503
    assert long_resp.headers["content-type"] == "application/json"
    assert long_resp.json()["error"]["code"] == "server_shutdown"
    assert timeout - 0.1 < elapsed < timeout + 2
    assert drain.running == 0 and drain.cut == 2 and drain.refused == 1
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown:")]
    assert "of 4 running requests 2 finished and 2 were cut" in line and "1 new requests refused" in line


async def test_a_stream_with_nothing_to_send_at_the_deadline_still_ends_cleanly():
    """A stream waiting for its next event (queued, a long prefill, a stalled engine) gets its
    error event and [DONE] at the deadline, though no event came to wake it."""
    engine = FakeEngine(max_model_len=100_000)
    engine.step_delay = 0.01
    async with live_server(engine, shutdown_timeout_s=0.5) as (_, http, drain):
        try:
            data = []
            draining = None
            body = {"prompt": "p", "max_tokens": None, "temperature": 1.0, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        data.append(line[6:])
                        if len(data) == 3:
                            engine.paused = True  # no more tokens
                            draining = asyncio.create_task(drain.run())
            await asyncio.wait_for(draining, 3)
        finally:
            engine.paused = False
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "server_shutdown"
    assert drain.cut == 1


async def test_a_second_signal_cuts_at_once():
    engine = FakeEngine(max_model_len=100_000)
    engine.step_delay = 0.01
    async with live_server(engine, shutdown_timeout_s=60) as (client, http, drain):
        body = {"prompt": "p", "max_tokens": None, "temperature": 1.0}
        plain = asyncio.create_task(http.post("/v1/completions", json=body))
        await wait_until(lambda: client.num_running == 1)
        draining = asyncio.create_task(drain.run())
        await wait_until(lambda: drain.stopping)
        drain.cut_now()
        await asyncio.wait_for(draining, 3)
        resp = await plain
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "server_shutdown"


class CountingStatsEngine(FakeEngine):
    """FakeEngine with `stats`: the number of steps so far, and how often it was built."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.num_steps = 0
        self.stats_builds = 0

    def step(self):
        self.num_steps += 1
        return super().step()

    @property
    def stats(self) -> dict:
        self.stats_builds += 1
        return {"num_steps": self.num_steps}


async def test_engine_stats_are_built_at_most_every_interval_and_exact_when_a_burst_ends():
    engine = CountingStatsEngine(max_model_len=100_000, tokens_per_step=1)
    client = EngineClient(lambda: engine, max_waiting=8)
    client.start()
    await client.wait_ready()
    try:
        stream = await client.submit("r", ["p"], [SamplingParams(max_tokens=400, temperature=1.0)])
        outs = [out async for _, out in stream]
        assert outs[-1].finish_reason == "length"
        assert client.engine_stats == {"num_steps": engine.num_steps}  # published before the last output
        assert engine.num_steps >= 400
        assert engine.stats_builds < engine.num_steps / 4  # not once per step
    finally:
        client.shutdown()
