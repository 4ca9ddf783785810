"""The real server with one test hook: a prompt containing FAULT_MARKER makes engine.step()
raise once, with a message full of "internals", so tests can check that a 500 leaks none of it
and that the server keeps serving afterwards. Run exactly like `python -m server`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eagle_core.engine import Engine  # noqa: E402
from server.__main__ import main  # noqa: E402

FAULT_MARKER = "TRIGGER-INTERNAL-ERROR"
SECRET = "Traceback: /secret/internal/path.py line 42, CUDA context 0xdeadbeef"

_add_request = Engine.add_request
_step = Engine.step


def add_request(self, request_id, prompt, params):
    text = prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)
    if FAULT_MARKER in text:
        self._fault_pending = True
    return _add_request(self, request_id, prompt, params)


def step(self):
    if getattr(self, "_fault_pending", False):
        self._fault_pending = False
        raise RuntimeError(SECRET)
    return _step(self)


def install() -> None:
    Engine.add_request = add_request
    Engine.step = step


if __name__ == "__main__":
    install()
    main()
