"""The two servers under test and the streaming client that drives them.

`ServerProcess` runs `python -m server` on a free loopback port, waits for /health and stops
it again. `stream_chat` sends one streamed chat request and records, per content chunk, its
arrival time and text; nothing else happens on the hot path (JSON is decoded after the stream
ends), so the client adds as little as it can to the latencies it measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One eagle-serve process. `args` are its CLI flags (without --host/--port)."""

    def __init__(self, name: str, args: list[str], log_path: Path):
        self.name = name
        self.args = args
        self.log_path = log_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 (the child owns it until stop())
        self.proc = subprocess.Popen(
            self.command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
        log.close()

    async def wait_healthy(self, client: httpx.AsyncClient, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                resp = await client.get(f"{self.base_url}/health", timeout=5)
                if resp.status_code == 200:
                    return
                if resp.json().get("status") == "failed":
                    raise RuntimeError(f"{self.name} server failed to load:\n{self.log_tail()}")
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
        raise TimeoutError(f"{self.name} server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@dataclass
class StreamRecord:
    """What the client saw of one streamed chat completion (times from time.perf_counter)."""

    prompt_id: str
    server: str
    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_texts: list[str] = field(default_factory=list)
    finished_at: float = 0.0
    text: str = ""
    finish_reason: str | None = None
    spec_decode: dict | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """usage.prompt_tokens_details.cached_tokens (prompt tokens the prefix cache served)."""
    error: str | None = None
    chunk_tokens: list[int] = field(default_factory=list)
    """Tokens per content chunk; filled after the run (see serve_bench.count_chunk_tokens)."""

    @property
    def latency(self) -> float:
        return self.finished_at - self.sent_at


def chat_body(messages: list[dict], max_tokens: int, temperature: float, seed: int | None, ignore_eos: bool) -> dict:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if seed is not None:
        body["seed"] = seed
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def stream_chat(
    client: httpx.AsyncClient, server: ServerProcess, prompt_id: str, body: dict, timeout_s: float = 3600
) -> StreamRecord:
    """Send one streamed chat request; raises on an HTTP error or an error event."""
    lines: list[tuple[float, str]] = []
    sent_at = time.perf_counter()
    async with client.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=timeout_s
    ) as resp:
        if resp.status_code != 200:
            await resp.aread()
            raise RuntimeError(f"{server.name}: HTTP {resp.status_code}: {resp.text[:300]}")
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                lines.append((time.perf_counter(), line[5:].strip()))
    record = StreamRecord(prompt_id, server.name, sent_at, finished_at=time.perf_counter())
    _decode_events(record, lines)
    return record


def _decode_events(record: StreamRecord, lines: list[tuple[float, str]]) -> None:
    parts = []
    for t, data in lines:
        if data == "[DONE]":
            continue
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"{record.server}: error event: {event['error']}")
        if event.get("usage"):
            record.prompt_tokens = event["usage"]["prompt_tokens"]
            record.completion_tokens = event["usage"]["completion_tokens"]
            record.cached_tokens = (event["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        for choice in event.get("choices", []):
            content = (choice.get("delta") or {}).get("content")
            if content:
                record.chunk_times.append(t)
                record.chunk_texts.append(content)
                parts.append(content)
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
                record.spec_decode = choice.get("spec_decode")
    record.text = "".join(parts)


async def tokenize_messages(client: httpx.AsyncClient, server: ServerProcess, messages: list[dict]) -> list[int]:
    """The prompt token ids the server builds from `messages` (its chat template)."""
    resp = await client.post(f"{server.base_url}/tokenize", json={"messages": messages}, timeout=60)
    resp.raise_for_status()
    return resp.json()["tokens"]


async def scrape_metrics(client: httpx.AsyncClient, server: ServerProcess) -> dict[tuple, float]:
    resp = await client.get(f"{server.base_url}/metrics", timeout=30)
    resp.raise_for_status()
    return parse_prometheus(resp.text)


def parse_prometheus(text: str) -> dict[tuple, float]:
    """{(name, ((label, value), ...)): value} of a Prometheus text exposition (no escapes in
    label values are expected from eagle-serve)."""
    samples: dict[tuple, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            label_text, value = rest.rsplit("}", 1)
            labels = []
            for pair in label_text.split(","):
                if "=" in pair:
                    key, val = pair.split("=", 1)
                    labels.append((key.strip(), val.strip().strip('"')))
            key = (name, tuple(sorted(labels)))
        else:
            name, value = line.split(None, 1)
            key = (name, ())
        try:
            samples[key] = float(value.split()[0])
        except (ValueError, IndexError):
            continue
    return samples
