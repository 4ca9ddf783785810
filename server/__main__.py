"""`eagle-serve` / `python -m server`: parse the configuration, start uvicorn, load the engine.

uvicorn starts listening first and the engine loads on the engine client's thread, so /health
answers 503 while a large model loads instead of refusing connections. If loading fails the
server stops and the process exits with status 1. SIGTERM and SIGINT drain the server
(server/shutdown.py) and it exits with status 0.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence

import uvicorn

from eagle_core.config import EngineConfig
from server.app import create_app
from server.args import ConfigError, parse_args
from server.engine_client import EngineClient
from server.shutdown import EXIT_GRACE_S, DrainingServer

logger = logging.getLogger("server")


def load_engine(config: EngineConfig):
    # Imported here, on the engine thread: importing torch and the model code takes seconds
    # that /health should spend answering 503, not spend with the port closed.
    from eagle_core import Engine

    return Engine(config)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        engine_config, settings = parse_args(argv)
    except ConfigError as exc:
        print(f"eagle-serve: error: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if settings.served_model_name is None:
        # Like vLLM: clients name the model the way the operator did on the command line.
        settings = dataclasses.replace(settings, served_model_name=engine_config.model.model)

    client = EngineClient(
        lambda: load_engine(engine_config), max_waiting=engine_config.scheduler.max_waiting
    )
    app = create_app(client, settings)
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            # Starts once the app's drain has answered every accepted request.
            timeout_graceful_shutdown=EXIT_GRACE_S,
        ),
        app.state.drain,
    )

    def stop_on_load_failure(exc: BaseException) -> None:
        logger.error("model failed to load, shutting down: %s", exc)
        server.should_exit = True

    client.on_load_failed = stop_on_load_failure
    logger.info(
        "eagle-serve listening on http://%s:%d (model %r, served as %r); loading the model",
        settings.host,
        settings.port,
        engine_config.model.model,
        settings.served_model_name,
    )
    server.run()
    if client.state == "failed":
        sys.exit(1)


if __name__ == "__main__":
    main()
