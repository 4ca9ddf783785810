"""docs/configuration.md is the generated flag reference, current with the CLI."""

from __future__ import annotations

import re
from pathlib import Path

from server.args import build_parser
from server.flag_reference import field_docs, render
from server.settings import ServerSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_is_what_the_generator_writes():
    assert DOC.read_text() == render(), "regenerate: python -m server.flag_reference > docs/configuration.md"


def test_every_flag_of_the_help_appears_in_the_reference():
    text = DOC.read_text()
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", build_parser().format_help())) - {"--help"}
    assert len(flags) > 30
    missing = sorted(flag for flag in flags if f"`{flag}" not in text)
    assert missing == []


def test_field_docstrings_are_read_from_the_source():
    docs = field_docs(ServerSettings)
    assert docs["host"].startswith("Interface to listen on")
    assert "port" not in docs  # a field without a docstring
