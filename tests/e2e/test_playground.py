"""The playground at `/` in a real headless browser: Debian's chromium driven by Playwright.

The page streams an answer and colours each token by its source (the `token_sources`
extension): with speculation some tokens are accepted drafts, without it none are. The default
model serves both, eagerly (a start of seconds): with its head drafting at every step
(`--spec-max-batch 0`, so the speculation policy's state cannot decide the test), and with
`--no-speculation` behind an API key. Skipped where chromium or Playwright is missing
(`.ci/run` installs chromium; `make install` Playwright).
Set EAGLE_SERVE_SCREENSHOT to a path to keep the speculating page's screenshot there as well
(docs/playground.png is made this way).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.e2e.server_process import API_KEY, ServerProcess, start_server, stop_server

CHROMIUM = Path("/usr/bin/chromium")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (make install adds it)")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM} (Debian package chromium; .ci/run installs it)"),
]

# The machine's network is closed: without these, chromium keeps trying to reach Google's hosts.
_CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_DRAFTED = ".msg.assistant .tok[data-source='head'], .msg.assistant .tok[data-source='lookup']"


_EAGER = ["--dtype", "float32", "--device", "cpu", "--compile", "off"]


@pytest.fixture(scope="module")
def drafting_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("playground_drafting") / "server.log"
    server = start_server([*_EAGER, "--spec-max-batch", "0"], log)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("playground_plain") / "server.log"
    server = start_server([*_EAGER, "--no-speculation"], log, api_key=API_KEY)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=_CHROMIUM_ARGS)
        yield browser
        browser.close()


def _ask(browser, server: ServerProcess, prompt: str, screenshot: Path) -> dict:
    """Load the page, enter the API key if the server has one, send `prompt`, wait for the
    streamed answer to end; returns what the page shows."""
    page = browser.new_page(viewport={"width": 1280, "height": 820})
    try:
        page.goto(server.url + "/")
        if server.api_key:
            page.fill("#api-key", server.api_key)
            page.dispatch_event("#api-key", "change")
        page.fill("#max_tokens", "96")
        page.fill("#prompt", prompt)
        page.click("#send")
        page.wait_for_selector(".msg.assistant[data-state='done']", timeout=300_000)
        page.screenshot(path=str(screenshot), full_page=True)
        return {
            "text": page.inner_text(".msg.assistant .body"),
            "chunks": int(page.get_attribute(".msg.assistant", "data-chunks") or 0),
            "tokens": page.locator(".msg.assistant .tok").count(),
            "drafted": page.locator(_DRAFTED).count(),
            "rate": page.inner_text("#stat-rate"),
            "error": page.inner_text("#error") if page.is_visible("#error") else "",
            "key_stored": page.evaluate("localStorage.getItem('eagle-serve-api-key')"),
        }
    finally:
        page.close()


def test_speculation_shows_accepted_drafts_in_the_page(browser, drafting_server, tmp_path):
    shot = tmp_path / "playground.png"
    shown = _ask(browser, drafting_server, "Write a Python function that returns the sum of the squares of a list.", shot)
    assert not shown["error"]
    assert shown["text"].strip() and shown["tokens"] > 10
    assert shown["chunks"] > 1  # the text came in as a stream, piece by piece
    assert shown["drafted"] > 0, shown  # the shipped head's drafts, accepted
    assert float(shown["rate"]) > 0
    assert shot.stat().st_size > 10_000
    if os.environ.get("EAGLE_SERVE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["EAGLE_SERVE_SCREENSHOT"])


def test_without_speculation_no_token_is_a_draft_and_the_key_entered_in_the_page_works(browser, plain_server, tmp_path):
    """The page sends the API key its user entered, and keeps it in the browser."""
    shown = _ask(browser, plain_server, "Write a Python function that returns the sum of the squares of a list.",
                 tmp_path / "plain.png")
    assert not shown["error"]
    assert shown["text"].strip() and shown["tokens"] > 10 and shown["chunks"] > 1
    assert shown["drafted"] == 0
    assert shown["key_stored"] == plain_server.api_key
