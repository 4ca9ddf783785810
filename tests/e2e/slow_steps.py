"""The real server with every engine step STEP_DELAY_S slower, so that a test has requests in
flight when it signals the server. Run exactly like `python -m server`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eagle_core.engine import Engine  # noqa: E402
from server.__main__ import main  # noqa: E402

STEP_DELAY_S = 0.05

_step = Engine.step


def step(self):
    time.sleep(STEP_DELAY_S)
    return _step(self)


if __name__ == "__main__":
    Engine.step = step
    main()
