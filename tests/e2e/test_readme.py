"""The README's quick start, run as written against a real server (only the port changes):
its curl command and its SDK snippet get answers, its make targets exist, and the files and
documents it links to are in the tree."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8000"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_the_curl_command_gets_a_chat_answer(smollm2_server):
    (command,) = [b for b in _blocks("bash") if b.lstrip().startswith("curl")]
    argv = shlex.split(command.replace("\\\n", " ").replace(DEFAULT_URL, smollm2_server.url))
    out = subprocess.run(argv + ["--silent", "--show-error", "--fail"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert '"chat.completion"' in out.stdout and '"content":' in out.stdout


def test_the_sdk_snippet_streams_an_answer(smollm2_server):
    pytest.importorskip("openai")
    (snippet,) = [b for b in _blocks("python") if "OpenAI(" in b]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet.replace(DEFAULT_URL, smollm2_server.url), {})  # noqa: S102 - the README's own code
    assert printed.getvalue().strip()


def test_the_make_targets_and_linked_files_exist():
    makefile = (REPO / "Makefile").read_text()
    for target in set(re.findall(r"^make ([\w-]+)", "\n".join(_blocks("bash")), flags=re.M)):
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), target
    for link in re.findall(r"\]\(((?!https?:)[^)#]+)", README):
        assert (REPO / link).exists(), link
