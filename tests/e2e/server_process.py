"""Start and stop the real server process (`python -m server`) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
API_KEY = "e2e-secret-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen
    log_path: Path
    model: str
    api_key: str | None = None
    saw_loading: bool = False
    """Whether /health answered 503 before 200 while the model loaded."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of a metric on /metrics whose labels include `labels`."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        total = 0.0
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample.split("{")[0] == name and all(w in sample for w in wanted):
                total += float(value)
        return total


def start_server(
    args: list[str],
    log_path: Path,
    api_key: str | None = None,
    entry: list[str] | None = None,
    timeout: float = 480,
) -> ServerProcess:
    port = free_port()
    cmd = [
        *(entry or [sys.executable, "-m", "server"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("EAGLE_SERVE_API_KEY", None)
    if api_key:
        env["EAGLE_SERVE_API_KEY"] = api_key  # through the environment, as deployments do
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = ServerProcess(
        f"http://127.0.0.1:{port}",
        proc,
        log_path,
        args[args.index("--model") + 1] if "--model" in args else "smollm2",
        api_key,
    )
    deadline = time.monotonic() + timeout
    saw_503 = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            status = httpx.get(server.url + "/health", timeout=2).status_code
        except httpx.TransportError:
            status = None
        if status == 503:
            saw_503 = True
        if status == 200:
            server.saw_loading = saw_503
            return server
        time.sleep(0.2)
    stop_server(server)
    raise RuntimeError(f"server not healthy after {timeout}s:\n{server.log_tail()}")


def stop_server(server: ServerProcess) -> None:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(5)
