"""bench.structured_outputs' schemas, requests and table (no server)."""

from __future__ import annotations

import jsonschema

from bench.structured_outputs import (
    NO_GRAMMAR_DRAFTING,
    PLAIN,
    SCHEMAS,
    SPEC,
    render,
    requests,
    same_text,
)


def test_the_schemas_are_valid_distinct_and_each_gets_its_requests():
    assert len({name for name, _, _ in SCHEMAS}) == len(SCHEMAS) == 10
    for _, _, schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema)
    reqs = requests(3)
    assert len(reqs) == 30 and len({r["id"] for r in reqs}) == 30
    assert len({r["messages"][0]["content"] for r in reqs}) == 30  # variants differ


def test_table_counts_valid_answers_and_lists_the_invalid_ones():
    answers = {"a": {"valid": True, "error": None}, "b": {"valid": False, "error": "'age' is a required property"}}
    passes = [
        {"server": SPEC, "temperature": 0.0, "clients": 1, "requests": 2, "valid": 1, "finished_stop": 2,
         "output_tok_s": 51.25, "mean_acceptance_length": 3.5, "answers": answers},
        {"server": PLAIN, "temperature": 0.0, "clients": 1, "requests": 2, "valid": 2, "finished_stop": 2,
         "output_tok_s": 30.0, "mean_acceptance_length": None, "answers": {"a": answers["a"]}},
    ]
    passes.append({**passes[0], "server": NO_GRAMMAR_DRAFTING, "answers": {"a": answers["a"], "b": {**answers["b"], "text": "y"}}})
    for p, texts in zip(passes, (("x", "y"), ("x", "y"), ("x", "z"))):
        p["answers"] = {k: {**a, "text": t} for (k, a), t in zip(p["answers"].items(), texts)}
    same = same_text(passes)
    assert same == {SPEC: [1, 1], NO_GRAMMAR_DRAFTING: [1, 1]}
    text = render({"passes": passes, "same_text_t0": same, "machine": {"cpu": "cpu"},
                   "settings": {"command": "c", "per_schema": 5, "max_tokens": 256}})
    assert "| default | 0 | 1 | 1/2 | 2/2 | 51.2 | 3.50 |" in text
    assert "| no-speculation | 0 | 1 | 2/2 | 2/2 | 30.0 | - |" in text
    assert "default gave the text of `--no-speculation` in 1/1 requests" in text and "default T=0 c=1 b: 'age' is a required property" in text


def test_bounded_adds_limits_only_where_a_schema_has_none():
    from bench.structured_outputs import MAX_STRING, bounded

    schema = {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string", "enum": ["x"]}, "c": {"type": "string", "maxLength": 5},
        "d": {"type": "integer", "minimum": 1}, "e": {"type": "array", "items": {"type": "string"}}}}
    props = bounded(schema)["properties"]
    assert props["a"]["maxLength"] == MAX_STRING and "maxLength" not in props["b"] and props["c"]["maxLength"] == 5
    assert props["d"] == {"type": "integer", "minimum": 1, "maximum": 10**6}
    assert props["e"]["items"]["maxLength"] == MAX_STRING
    assert "maxLength" not in schema["properties"]["a"]  # the input is left alone
