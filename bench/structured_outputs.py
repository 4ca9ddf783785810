"""JSON-schema answers through the OpenAI SDK: every answer must parse and validate.

    .venv/bin/python -m bench.structured_outputs [--per-schema 5] [--max-tokens 256]
        [--clients 1,8] [--machine NAME] [-- server flags, e.g. --dtype float32]

The default server (speculation on) gets --per-schema requests for each of 10 schemas (nested
objects, arrays, enums, bounded numbers, required and optional fields; strings and integers
bounded, see MAX_STRING) at T=0 and at T=1 (seeded),
with each count of closed-loop clients; each answer is checked with `jsonschema`. Then a
`--no-grammar-drafting` server (trees verified as drafted) and a `--no-speculation` server, each
with the same flags otherwise, answer the same requests at T=0 and T=1 with one client, and the
T=0 texts of the speculating servers are compared with plain decoding's. Per pass: valid
answers, finish reasons, output tokens/s and mean acceptance length. Writes bench/results/structured-outputs-<date>-<machine>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jsonschema
import openai

from bench.client import ServerProcess
from bench.environment import run_http_bench

SPEC, NO_GRAMMAR_DRAFTING, PLAIN = "default", "no-grammar-drafting", "no-speculation"

SCHEMAS: list[tuple[str, str, dict]] = [
    ("person", "Invent a person and describe them.", {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "email": {"type": "string"}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("book", "Describe a classic novel.", {
        "type": "object",
        "properties": {"title": {"type": "string"}, "author": {"type": "string"},
                       "year": {"type": "integer", "minimum": 1000, "maximum": 2030},
                       "genres": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4}},
        "required": ["title", "author", "year", "genres"], "additionalProperties": False}),
    ("weather", "Give a weather report for a city of your choice.", {
        "type": "object",
        "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
                       "condition": {"enum": ["sunny", "cloudy", "rain", "snow", "storm"]},
                       "humidity": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["city", "temperature_c", "condition"], "additionalProperties": False}),
    ("order", "Write an order of three items from a grocery store.", {
        "type": "object",
        "properties": {"order_id": {"type": "integer", "minimum": 1},
                       "items": {"type": "array", "minItems": 1, "maxItems": 5, "items": {
                           "type": "object",
                           "properties": {"name": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                          "price": {"type": "number", "minimum": 0}},
                           "required": ["name", "quantity", "price"], "additionalProperties": False}},
                       "paid": {"type": "boolean"}},
        "required": ["order_id", "items", "paid"], "additionalProperties": False}),
    ("address", "Write the postal address of a museum.", {
        "type": "object",
        "properties": {"name": {"type": "string"}, "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "postcode": {"type": "string"},
                           "country": {"type": "string"}},
            "required": ["street", "city", "country"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False}),
    ("sentiment", "Classify the sentiment of: 'The food was cold but the staff were lovely.'", {
        "type": "object",
        "properties": {"label": {"enum": ["positive", "negative", "mixed", "neutral"]},
                       "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                       "reasons": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["label", "confidence"], "additionalProperties": False}),
    ("recipe", "Give a simple pancake recipe.", {
        "type": "object",
        "properties": {"dish": {"type": "string"}, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                       "ingredients": {"type": "array", "minItems": 2, "maxItems": 8, "items": {"type": "string"}},
                       "vegetarian": {"type": "boolean"}},
        "required": ["dish", "servings", "ingredients"], "additionalProperties": False}),
    ("event", "Describe a music festival.", {
        "type": "object",
        "properties": {"event": {"type": "string"}, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                       "days": {"type": "integer", "minimum": 1, "maximum": 10},
                       "headliners": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["event", "date", "days"], "additionalProperties": False}),
    ("planet", "Describe the planet Mars.", {
        "type": "object",
        "properties": {"planet": {"type": "string"}, "moons": {"type": "integer", "minimum": 0, "maximum": 200},
                       "has_rings": {"type": "boolean"},
                       "facts": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}},
        "required": ["planet", "moons", "has_rings", "facts"], "additionalProperties": False}),
    ("ticket", "File a support ticket about a broken laptop screen.", {
        "type": "object",
        "properties": {"title": {"type": "string"}, "priority": {"enum": ["low", "medium", "high", "urgent"]},
                       "tags": {"type": "array", "items": {"enum": ["hardware", "software", "billing", "network"]}, "maxItems": 2},
                       "customer": {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer", "minimum": 1}},
                                    "required": ["name"], "additionalProperties": False}},
        "required": ["title", "priority", "customer"], "additionalProperties": False}),
]


MAX_STRING = 60
"""Every free string gets this maxLength and every integer an upper bound (`bounded`): at T=0 the
135M default model repeats itself inside an unbounded string or number until max_tokens runs
out (10 of 50 answers of these schemas without the bounds), and no grammar can end that."""


def bounded(schema):
    """`schema` with maxLength MAX_STRING on strings that have no maxLength, pattern or enum, and
    a maximum on integers that have none."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v) for k, v in schema.items()}
    if out.get("type") == "string" and not {"maxLength", "pattern", "enum"} & out.keys():
        out["maxLength"] = MAX_STRING
    if out.get("type") == "integer" and "maximum" not in out:
        out["maximum"] = 10**6
    return out


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def requests(per_schema: int) -> list[dict]:
    """per_schema requests per schema: the schema's prompt with a varying detail."""
    out = []
    for name, prompt, schema in SCHEMAS:
        for k in range(per_schema):
            detail = "" if k == 0 else f" Make it different from the usual example (variant {k + 1})."
            out.append({"id": f"{name}-{k}", "schema_name": name, "schema": bounded(schema),
                        "messages": [{"role": "user", "content": f"{prompt}{detail} Answer in JSON."}]})
    return out


async def one_pass(sdk: openai.AsyncOpenAI, reqs: list[dict], temperature: float, clients: int, max_tokens: int) -> dict:
    queue = list(range(len(reqs)))
    answers: dict[str, dict] = {}

    async def client_loop() -> None:
        while queue:
            req = reqs[queue.pop(0)]
            fmt = {"type": "json_schema", "json_schema": {"name": req["schema_name"], "schema": req["schema"], "strict": True}}
            resp = await sdk.chat.completions.create(
                model="smollm2", messages=req["messages"], max_tokens=max_tokens, temperature=temperature,
                seed=7, response_format=fmt)
            choice = resp.choices[0]
            try:
                jsonschema.validate(json.loads(choice.message.content), req["schema"])
                valid, error = True, None
            except (ValueError, jsonschema.ValidationError) as err:
                valid, error = False, str(err).splitlines()[0][:200]
            spec = (choice.model_extra or {}).get("spec_decode") or {}
            answers[req["id"]] = {"text": choice.message.content, "finish_reason": choice.finish_reason, "valid": valid,
                                  "error": error, "completion_tokens": resp.usage.completion_tokens,
                                  "acceptance_length": spec.get("mean_acceptance_length")}

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(clients)))
    wall = time.perf_counter() - start
    taus = [a["acceptance_length"] for a in answers.values() if a["acceptance_length"]]
    return {
        "temperature": temperature, "clients": clients, "requests": len(answers), "wall_s": wall,
        "valid": sum(a["valid"] for a in answers.values()),
        "finished_stop": sum(a["finish_reason"] == "stop" for a in answers.values()),
        "output_tok_s": sum(a["completion_tokens"] for a in answers.values()) / wall,
        "mean_acceptance_length": sum(taus) / len(taus) if taus else None,
        "answers": answers,
    }


async def run(args, extra: list[str]) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="structured-outputs-"))
    reqs = requests(args.per_schema)
    passes = []
    async with httpx.AsyncClient() as client:
        for name, flags in ((SPEC, list(extra)), (NO_GRAMMAR_DRAFTING, [*extra, "--no-grammar-drafting"]),
                            (PLAIN, [*extra, "--no-speculation"])):
            server = ServerProcess(name, flags, logs / f"{name}.log")
            try:
                server.start()
                await server.wait_healthy(client, args.start_timeout)
                sdk = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=3600)
                plan = [(t, c) for t in (0.0, 1.0) for c in args.clients] if name == SPEC else [(0.0, 1), (1.0, 1)]
                for temperature, clients in plan:
                    result = await one_pass(sdk, reqs, temperature, clients, args.max_tokens)
                    passes.append({"server": name, **result})
                    log(f"{name} T={temperature} clients={clients}: {result['valid']}/{result['requests']} valid, "
                        f"{result['output_tok_s']:.1f} tok/s, tau {result['mean_acceptance_length']}")
            finally:
                server.stop()
    return {"passes": passes, "same_text_t0": same_text(passes)}


def same_text(passes: list[dict]) -> dict[str, list[int]]:
    """Per speculating server: [T=0 one-client answers identical to plain decoding's, compared]."""
    def answers(name):
        return next(p["answers"] for p in passes if p["server"] == name and p["temperature"] == 0.0 and p["clients"] == 1)

    plain = answers(PLAIN)
    return {name: [sum(answers(name)[k]["text"] == plain[k]["text"] for k in plain), len(plain)]
            for name in (SPEC, NO_GRAMMAR_DRAFTING)}


def render(result: dict) -> str:
    settings = result["settings"]
    lines = [f"# Structured outputs ({result['machine'].get('cpu', '')})", "",
             f"Command: `{settings['command']}`", "",
             f"{len(SCHEMAS)} JSON schemas x {settings['per_schema']} requests, OpenAI SDK, `response_format` json_schema, "
             f"up to {settings['max_tokens']} tokens, closed-loop clients; answers checked with jsonschema.", "",
             "| server | T | clients | valid | finished by stop | output tok/s | mean tau |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for p in result["passes"]:
        tau = f"{p['mean_acceptance_length']:.2f}" if p["mean_acceptance_length"] else "-"
        lines.append(f"| {p['server']} | {p['temperature']:g} | {p['clients']} | {p['valid']}/{p['requests']} | "
                     f"{p['finished_stop']}/{p['requests']} | {p['output_tok_s']:.1f} | {tau} |")
    lines += [""] + [f"T=0, one client: {name} gave the text of `--no-speculation` in {same}/{total} requests."
                     for name, (same, total) in result["same_text_t0"].items()]
    invalid = [(p["server"], p["temperature"], p["clients"], k, a["error"]) for p in result["passes"]
               for k, a in p["answers"].items() if not a["valid"]]
    if invalid:
        lines += ["", "Invalid answers:", ""] + [f"- {s} T={t:g} c={c} {k}: {e}" for s, t, c, k, e in invalid]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-schema", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8])
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default="bench/results")
    run_http_bench("structured-outputs", "bench.structured_outputs", parser, run, render)


if __name__ == "__main__":
    main()
