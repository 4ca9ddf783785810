"""Model-written ("self") training prompts: the pre-query prefix, the filters, decontamination,
reproducible seeds, and how their files join a work dir that already holds other styles' data."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field

import pytest

from eagle_core.train.config import GenerateConfig, PromptsConfig, TrainConfig
from eagle_core.train.generate import _unpack_committed, run_prompts
from eagle_core.train.prompts import ID_BASE, prompt_style
from eagle_core.train.self_prompts import keep_request, make_self_prompts, pre_query_ids
from tests.models import make_tiny_tokenizer


def test_pre_query_prefix_ends_where_the_user_text_starts():
    tokenizer = make_tiny_tokenizer()
    ids = pre_query_ids(tokenizer)
    assert tokenizer.decode(ids) == "<|im_start|>user\n"
    full = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert full.startswith(tokenizer.decode(ids))


@dataclass
class _Out:
    text: str
    finish_reason: str
    token_ids: list[int] = field(default_factory=list)


class _FakeEngine:
    tokenizer = make_tiny_tokenizer()


class ScriptedLLM:
    """Answers the i-th request it is sent with script[i % len(script)]; records prompts and seeds."""

    def __init__(self, script: list[tuple[str, str, int]]):
        self.engine = _FakeEngine()
        self.script = script
        self.seeds: list[int] = []
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params, use_tqdm=False):
        assert len(prompts) == len(params)
        outs = []
        for prompt, p in zip(prompts, params):
            self.prompts.append(prompt)
            self.seeds.append(p.seed)
            text, reason, n = self.script[(len(self.seeds) - 1) % len(self.script)]
            outs.append(_Out(text, reason, list(range(n))))
        return outs


MTBENCH_LIKE = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences"
SCRIPT = [
    ("How do I keep basil alive on a windowsill?", "stop", 12),
    ("A request that ran to the cap and never finished", "length", 128),
    ("How do I keep basil alive on a windowsill?", "stop", 12),  # duplicate
    ("Hi", "stop", 2),  # too short
    ("日本語で説明してください。日本語で説明してください。", "stop", 20),  # not ASCII
    ("Please " + MTBENCH_LIKE.lower() + " and must-see attractions.", "stop", 30),  # evaluation overlap
    ("Write a haiku about a tired lighthouse keeper.", "stop", 11),
]


def test_filters_dedupe_decontaminate_and_number_the_requests():
    llm = ScriptedLLM(SCRIPT)
    rows = make_self_prompts(llm, 2, seed=5, temperature=1.0, max_tokens=128, avoid=[MTBENCH_LIKE], batch=7)
    assert [r["prompt"] for r in rows] == [
        "How do I keep basil alive on a windowsill?",
        "Write a haiku about a tired lighthouse keeper.",
    ]
    assert [r["id"] for r in rows] == [ID_BASE["self"], ID_BASE["self"] + 1]
    assert {r["category"] for r in rows} == {"self"}
    # every request starts from the same pre-query prefix, each with its own seed
    assert llm.prompts and all(p == pre_query_ids(llm.engine.tokenizer) for p in llm.prompts)
    assert len(set(llm.seeds)) == len(llm.seeds) == 7


def test_without_decontamination_the_overlapping_request_is_kept():
    rows = make_self_prompts(ScriptedLLM(SCRIPT), 3, seed=5, temperature=1.0, max_tokens=128, batch=7)
    assert rows[1]["prompt"].startswith("Please compose an engaging travel blog post")


def test_seeds_are_reproducible_and_depend_on_the_seed():
    a, b, c = ScriptedLLM(SCRIPT), ScriptedLLM(SCRIPT), ScriptedLLM(SCRIPT)
    make_self_prompts(a, 2, seed=1, temperature=1.0, max_tokens=64, batch=8)
    make_self_prompts(b, 2, seed=1, temperature=1.0, max_tokens=64, batch=8)
    make_self_prompts(c, 2, seed=2, temperature=1.0, max_tokens=64, batch=8)
    assert a.seeds == b.seeds
    assert not set(a.seeds) & set(c.seeds)


def test_a_model_that_never_finishes_a_request_is_an_error():
    llm = ScriptedLLM([("rambling on and on", "length", 128)])
    with pytest.raises(RuntimeError, match="passed the filters"):
        make_self_prompts(llm, 4, seed=0, temperature=1.0, max_tokens=128, batch=4)


def test_keep_request():
    assert keep_request("What is a prime number?", 8, "stop", 8)
    assert not keep_request("What is a prime number?", 8, "length", 8)
    assert not keep_request("What?", 3, "stop", 8)
    assert not keep_request("   ", 9, "stop", 8)


def test_prompt_style_of_an_id():
    assert [prompt_style(i) for i in (0, 383, 100_000, 104_991, 200_000, 202_047)] == [
        "basic", "basic", "rich", "rich", "self", "self"
    ]


def _write_gz(path, rows):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_committed_prompts_and_the_parts_up_to_the_configs_last_are_unpacked(tmp_path):
    committed = tmp_path / "data"
    committed.mkdir()
    rows = [{"id": ID_BASE["self"] + i, "category": "self", "prompt": f"question {i}"} for i in range(6)]
    _write_gz(committed / "prompts-self.jsonl.gz", rows)
    for part in (0, 3, 39, 40):
        _write_gz(committed / f"part-{part:05d}.jsonl.gz", [{"id": part, "response": "x"}])
    cfg = TrainConfig(
        work_dir=str(tmp_path / "work"),
        prompts=PromptsConfig(style="self", num_prompts=6, num_heldout=2),
        generate=GenerateConfig(committed_dir=str(committed), first_part=39),
    )
    # no model is loaded: the committed prompt file is used as is
    assert run_prompts(cfg) == rows
    out = tmp_path / "work" / "responses"
    _unpack_committed(str(committed), str(out), 40)  # parts 0-39: first_part 39, one part
    assert sorted(p.name for p in out.iterdir()) == [
        "part-00000.jsonl", "part-00003.jsonl", "part-00039.jsonl"
    ]


def test_an_extension_skips_earlier_requests_and_samples_past_their_seeds():
    llm = ScriptedLLM(SCRIPT)
    existing = ["How do I keep basil alive on a windowsill?", "An earlier request", "Another one"]
    rows = make_self_prompts(
        llm, 1, seed=5, temperature=1.0, max_tokens=128, batch=7, avoid=[MTBENCH_LIKE], existing=existing
    )
    # the basil request repeats an earlier one: the haiku is the first new request kept
    assert [r["prompt"] for r in rows] == ["Write a haiku about a tired lighthouse keeper."]
    assert rows[0]["id"] == ID_BASE["self"] + 3
    assert min(llm.seeds) == 5 * 1_000_003 + 20 * 3 + 7


def test_a_grown_self_prompt_set_keeps_its_held_out_prompts_last(tmp_path, monkeypatch):
    from eagle_core.train import generate

    rows = [{"id": ID_BASE["self"] + i, "category": "self", "prompt": f"question {i}"} for i in range(6)]
    cfg = TrainConfig(work_dir=str(tmp_path), prompts=PromptsConfig(style="self", num_prompts=9, num_heldout=2))
    generate.write_jsonl(generate.prompts_path(cfg), rows)
    asked = {}

    def fake_make_prompts(cfg, existing=()):
        asked["existing"] = list(existing)
        return [{"id": ID_BASE["self"] + 6 + i, "category": "self", "prompt": f"new {i}"} for i in range(3)]

    monkeypatch.setattr(generate, "_make_prompts", fake_make_prompts)
    grown = run_prompts(cfg)
    assert asked["existing"] == [r["prompt"] for r in rows]
    assert [r["prompt"] for r in grown] == [f"question {i}" for i in range(4)] + [
        "new 0", "new 1", "new 2", "question 4", "question 5"
    ]
    assert run_prompts(cfg) == grown  # written back: a rerun does not grow it again
