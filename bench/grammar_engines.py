"""Mask cost per token of the grammar engines a structured-outputs server could use, on the
default model's tokenizer: llguidance (what eagle_core/grammar.py uses) and xgrammar.

Walks JSON documents of a schema token by token, timing the mask of every position (what a
plain decoding step pays per constrained sequence; a draft tree pays it per node), plus the
grammar's compile time and a tree-style walk (rollback to a branch point, then forward).
Engines that are not installed are reported as such; xgrammar is not a dependency of this
project (it needs triton on Linux x86_64), so `pip install --no-deps xgrammar apache-tvm-ffi`
into a scratch environment to include it.

    python -m bench.grammar_engines --machine vm-epyc
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.environment import machine_name, write_result

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
DOCUMENTS = [
    {"name": "Alice Smith the third", "age": 42, "tags": ["a", "ccc", "bb"], "address": {"street": "12 Main Street, Springfield", "zip": "12345"}},
    {"name": "Bob", "age": 7, "tags": [], "address": {"street": "x"}},
    {"name": "Ünïcode ☃ name with \"quotes\"", "age": 150, "tags": ["bb"] * 6, "address": {"street": "Long street name " * 5, "zip": "9"}},
]
REPEATS = 5


class _Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self._ll, self._torch = llguidance, llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)

    def compile(self, schema: str):
        from eagle_core.grammar import JSON_OPTIONS

        return self._ll.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)

    def matcher(self, compiled):
        return self._ll.LLMatcher(self.tokenizer, compiled, log_level=0)

    def mask(self, matcher) -> None:
        self._torch.fill_next_token_bitmask(matcher, self.bitmask, 0)

    @staticmethod
    def accept(matcher, token: int) -> bool:
        return matcher.consume_token(token)

    @staticmethod
    def rollback(matcher, count: int) -> None:
        matcher.rollback(count)


class _Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar

        self._xg = xgrammar
        self.compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size))
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema, any_whitespace=False, separators=(", ", ": "))

    def matcher(self, compiled):
        return self._xg.GrammarMatcher(compiled, max_rollback_tokens=64)

    def mask(self, matcher) -> None:
        matcher.fill_next_token_bitmask(self.bitmask, 0)

    @staticmethod
    def accept(matcher, token: int) -> bool:
        return matcher.accept_token(token)

    @staticmethod
    def rollback(matcher, count: int) -> None:
        matcher.rollback(count)


def _summary(times: list[float]) -> dict:
    times = sorted(times)
    return {
        "n": len(times),
        "mean_us": round(statistics.fmean(times) * 1e6, 2),
        "median_us": round(times[len(times) // 2] * 1e6, 2),
        "p90_us": round(times[int(0.9 * len(times))] * 1e6, 2),
        "p99_us": round(times[int(0.99 * len(times))] * 1e6, 2),
    }


def measure(engine, tokenizer, eos: int) -> dict:
    schema = json.dumps(SCHEMA)
    started = time.perf_counter()
    compiled = engine.compile(schema)
    compile_s = time.perf_counter() - started
    walks = [tokenizer.encode(json.dumps(d, ensure_ascii=False), add_special_tokens=False) + [eos] for d in DOCUMENTS]
    linear, tree = [], []
    for ids in walks:
        for _ in range(REPEATS):
            matcher = engine.matcher(compiled)
            for token in ids:
                started = time.perf_counter()
                engine.mask(matcher)
                linear.append(time.perf_counter() - started)
                assert engine.accept(matcher, token), token
    for ids in walks:  # a tree's nodes: back 3 tokens, forward again, a mask at each
        matcher = engine.matcher(compiled)
        for k, token in enumerate(ids[:-1]):
            assert engine.accept(matcher, token)
            if k >= 3:
                started = time.perf_counter()
                engine.rollback(matcher, 3)
                for t in ids[k - 2 : k + 1]:
                    engine.accept(matcher, t)
                    engine.mask(matcher)
                tree.append((time.perf_counter() - started) / 3)
    return {"compile_ms": round(compile_s * 1e3, 3), "mask": _summary(linear), "tree_node": _summary(tree)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", default=None, help="a name for the machine, appended to the result file name")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from eagle_core.worker.loader import default_gguf_path, ensure_gguf_converted

    model_dir = ensure_gguf_converted(default_gguf_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    result = {"vocab_size": vocab_size, "schema": SCHEMA, "repeats": REPEATS, "engines": {}}
    for cls in (_Llguidance, _Xgrammar):
        try:
            engine = cls(tokenizer, vocab_size)
        except ImportError as err:
            result["engines"][cls.name] = {"error": f"not installed ({err})"}
            continue
        result["engines"][cls.name] = measure(engine, tokenizer, tokenizer.eos_token_id)
        print(cls.name, json.dumps(result["engines"][cls.name]))
    suffix = f"-{machine_name(args.machine)}" if args.machine else ""
    print(f"wrote {write_result(args.out, 'grammar-engines', result, suffix)}")


if __name__ == "__main__":
    main()
