"""The playground at `/` in a real headless browser: Debian's chromium driven by Playwright.

The page streams an answer and colours each token by its source (the `token_sources`
extension): with speculation some tokens are accepted drafts, without it none are. Skipped
where chromium or Playwright is missing (`.ci/run` installs chromium; `make install` Playwright).
Set EAGLE_SERVE_SCREENSHOT to a path to keep the speculating page's screenshot there as well
(docs/playground.png is made this way).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.e2e.server_process import ServerProcess

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
        page.wait_for_selector(".msg.assistant[data-state='streaming'] .tok", timeout=120_000)  # streamed text
        page.wait_for_selector(".msg.assistant[data-state='done']", timeout=300_000)
        page.screenshot(path=str(screenshot), full_page=True)
        return {
            "text": page.inner_text(".msg.assistant .body"),
            "tokens": page.locator(".msg.assistant .tok").count(),
            "drafted": page.locator(_DRAFTED).count(),
            "rate": page.inner_text("#stat-rate"),
            "error": page.inner_text("#error") if page.is_visible("#error") else "",
            "key_stored": page.evaluate("localStorage.getItem('eagle-serve-api-key')"),
        }
    finally:
        page.close()


def test_speculation_shows_accepted_drafts_in_the_page(browser, smollm2_server, tmp_path):
    shot = tmp_path / "playground.png"
    shown = _ask(browser, smollm2_server, "Write a Python function that returns the sum of the squares of a list.", shot)
    assert not shown["error"]
    assert shown["text"].strip() and shown["tokens"] > 10
    assert shown["drafted"] > 0, shown  # the shipped head's drafts, accepted
    assert float(shown["rate"]) > 0
    assert shot.stat().st_size > 10_000
    if os.environ.get("EAGLE_SERVE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["EAGLE_SERVE_SCREENSHOT"])


def test_without_speculation_no_token_is_a_draft_and_the_key_entered_in_the_page_works(browser, tiny_server, tmp_path):
    """tiny_server has no draft head and an API key: the page sends the key its user entered."""
    shown = _ask(browser, tiny_server, "hello", tmp_path / "plain.png")
    assert not shown["error"]
    assert shown["text"] and shown["tokens"] > 0
    assert shown["drafted"] == 0
    assert shown["key_stored"] == tiny_server.api_key
