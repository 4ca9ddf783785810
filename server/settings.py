"""Server-only settings (HTTP, auth, limits): the one home of their defaults.

Engine settings live in eagle_core.config; this dataclass holds what only the HTTP layer needs.
server/args.py builds the CLI from both, so every default is written exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle_core.config import check_least


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    """Interface to listen on; loopback by default so a fresh install is not exposed."""
    port: int = 8000
    served_model_name: str | None = None
    """Name clients pass as `model`; None uses the engine's model name."""
    api_key: str | None = None
    """When set, /v1/*, /tokenize and /debug/* require `Authorization: Bearer <key>`."""
    allowed_origins: tuple[str, ...] = ()
    """CORS origins allowed to call the API from a browser ("*" for any); none by default."""
    max_request_bytes: int = 1_048_576
    """Largest accepted request body; bigger ones get 413 before any parsing."""
    retry_after_s: int = 1
    """Retry-After sent with 429 (queue full) and 503 (still loading)."""
    shutdown_timeout_s: float = 30.0
    """After SIGTERM/SIGINT, how long running requests may go on before they are cut with a
    `server_shutdown` error (server/shutdown.py)."""
    log_level: str = "info"

    def __post_init__(self) -> None:
        check_least(self, (("max_request_bytes", 1), ("retry_after_s", 0)))
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        if not self.shutdown_timeout_s >= 0:
            raise ValueError(f"shutdown_timeout must be at least 0, got {self.shutdown_timeout_s}")
