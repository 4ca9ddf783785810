"""bench/results/README.md is the generated index of the result files, current with the tree."""

from __future__ import annotations

from bench.results_index import RESULTS, citing_sections, render, runs


def test_the_committed_index_is_what_the_generator_writes():
    assert (RESULTS / "README.md").read_text() == render(), "regenerate: python -m bench.results_index > bench/results/README.md"


def test_runs_group_a_runs_files_under_their_benchmark():
    grouped = runs(["peers-2026-12-07-vm-x.json", "peers-2026-12-07-vm-x.md", "2026-12-02-vm-amx-speedup.png", "notes.txt"])
    assert grouped["peers"] == {("2026-12-07", "peers-2026-12-07-vm-x"): ["peers-2026-12-07-vm-x.json", "peers-2026-12-07-vm-x.md"]}
    assert grouped["serve_bench"] == {("2026-12-02", "2026-12-02-vm-amx-speedup"): ["2026-12-02-vm-amx-speedup.png"]}
    assert grouped["other"] == {("", "notes"): ["notes.txt"]}


def test_a_file_is_cited_by_the_sections_that_link_it():
    doc = "# B\n## One\nsee [r](../bench/results/a-2026-01-01.md)\n## Two\nnothing\n### Three\nbench/results/a-2026-01-01.md again\n"
    assert citing_sections(doc) == {"a-2026-01-01.md": ["One", "Three"]}
    index = render(["a-2026-01-01.md", "b-2026-01-02.json"], doc)
    assert "| 2026-01-01 | a-2026-01-01 | [.md](a-2026-01-01.md) | One; Three |" in index
    assert "| 2026-01-02 | b-2026-01-02 | [.json](b-2026-01-02.json) | - |" in index
