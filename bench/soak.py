"""Soak: thousands of mixed requests against one fresh server, its memory sampled over time,
and every request accounted for on both sides.

    .venv/bin/python -m bench.soak [--requests 3000] [--max-seconds 3600] [--clients 4]
        [--max-tokens 8 48] [--sample-seconds 5] [--server-args "..."] [--machine NAME]

Starts `python -m server` (the default model unless --model says otherwise) on a free
loopback port, sends a few warm-up requests, then --clients closed-loop clients share a list
of --requests requests planned up front from --seed (`plan`): chat and completions, streamed
and not, max_tokens drawn from --max-tokens, some with n=2 or two prompts, logprobs, stop
strings, seeds; some streams are dropped by their client after the first content chunk
(cancelled), and a few requests are invalid on purpose (400 and 404). No new request starts
after --max-seconds; the ones in flight finish.

Meanwhile the server's resident memory (VmRSS of its process, and of its child processes, from
/proc) is sampled every --sample-seconds, with the number of requests done so far.

Accounting, checked at the end (`reconcile`): the client counts what it sent, what completed
(every choice with a finish_reason), what it cancelled, and the errors by HTTP status and
error code; the server's /metrics counters (eagle_request_success_total by finished_reason,
eagle_request_failure_total by reason), read before the soak and after it, must agree:
every sequence the server accepted finished as stop/length or as an abort its own client
caused, and every error the server counted is one the client received. A cancelled stream
whose answer the server had already finished counts as stop/length there; the result says how
many did ("raced").

Output: bench/results/soak-<date>-<host>[-<machine>].json (settings, the server command, the
client and server counts, the checks, every RSS sample) and .md (the counts and RSS by
requests done). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import environment, workloads
from bench.client import REPO_ROOT, parse_prometheus
from bench.peers import Launch, PeerProcess, git_revision, log

STOP_STRINGS = (["\n\n"], ["."], ["def ", "\n\n"], [" the "])
INVALID_KINDS = ("bad_temperature", "unknown_model", "malformed_json", "missing_messages")
EXPECTED_ERRORS = {
    "bad_temperature": (400, "invalid_value"),
    "unknown_model": (404, "model_not_found"),
    "malformed_json": (400, "invalid_value"),
    "missing_messages": (400, "invalid_value"),
}


# ----------------------------------------------------------------------------- the plan


@dataclass
class PlannedRequest:
    """One request of the soak. `body` is JSON (or raw bytes for a malformed one); `choices` is
    how many sequences the server runs for it (n x prompts); `cancel` drops the stream after its
    first content chunk; `invalid` names the kind of error it must get back."""

    index: int
    path: str
    body: dict | bytes
    stream: bool
    choices: int
    cancel: bool = False
    invalid: str | None = None


def plan(count: int, prompts: list[str], seed: int, max_tokens: tuple[int, int]) -> list[PlannedRequest]:
    """`count` mixed requests, the same for the same arguments. About 45% chat and 52%
    completions (streamed or not, half each), 3% invalid; among the valid ones ~12% ask for two
    choices, ~15% for logprobs, ~20% carry stop strings, ~30% a seed (T=0.8), half are greedy;
    ~10% of the streams with one choice are cancelled by their client."""
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        roll = rng.random()
        if roll < 0.03:
            requests.append(_invalid(index, rng.choice(INVALID_KINDS), rng.choice(prompts)))
            continue
        chat = roll < 0.48
        stream = rng.random() < 0.5
        body: dict = {"max_tokens": rng.randint(*max_tokens)}
        sampling = rng.random()
        if sampling < 0.5:
            body["temperature"] = 0.0
        elif sampling < 0.8:
            body["temperature"] = 0.8
            body["seed"] = rng.randrange(1 << 31)
        else:
            body["temperature"] = 1.0
        if rng.random() < 0.2:
            body["stop"] = rng.choice(STOP_STRINGS)
        two = rng.random() < 0.12
        choices = 1
        if chat:
            body["messages"] = [{"role": "user", "content": rng.choice(prompts)}]
            if two:
                body["n"] = choices = 2
            if rng.random() < 0.15:
                body["logprobs"] = True
                body["top_logprobs"] = 2
        else:
            if two:  # completions: two prompts rather than n
                body["prompt"] = [rng.choice(prompts), rng.choice(prompts)]
                choices = 2
            else:
                body["prompt"] = rng.choice(prompts)
            if rng.random() < 0.15:
                body["logprobs"] = 2
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        cancel = stream and choices == 1 and rng.random() < 0.1
        path = "/v1/chat/completions" if chat else "/v1/completions"
        requests.append(PlannedRequest(index, path, body, stream, choices, cancel))
    return requests


def _invalid(index: int, kind: str, prompt: str) -> PlannedRequest:
    messages = [{"role": "user", "content": prompt}]
    body: dict | bytes = {
        "bad_temperature": {"messages": messages, "temperature": 5.0},
        "unknown_model": {"model": "no-such-model", "messages": messages},
        "malformed_json": b'{"messages": [',
        "missing_messages": {"max_tokens": 8},
    }[kind]
    return PlannedRequest(index, "/v1/chat/completions", body, False, 0, invalid=kind)


def prompt_texts(count: int = 120) -> list[str]:
    """Prompts of the soak: MT-bench first turns and HumanEval problems (bench.workloads)."""
    code = count // 4
    pool = workloads.sweep_pool(workloads.mt_bench_questions(count - code), workloads.humaneval_prompts(code))
    return [messages[0]["content"] for _, messages in pool]


# ----------------------------------------------------------------------------- the client's count


@dataclass
class ClientTally:
    """What the clients saw. A request is `completed` when every choice got a finish_reason
    (and a stream its [DONE]), `cancelled` when its client dropped it, an `error` when it got
    an HTTP error (by "status code"), `unexpected` otherwise (an error event, a cut stream, a
    transport error, an invalid request answered 200). `misanswered` lists the HTTP errors
    that were not the planned ones (a valid request refused, an invalid one refused with
    another status or code). The soak fails on any unexpected or misanswered request."""

    sent: int = 0
    invalid_sent: int = 0
    completed: int = 0
    cancelled: int = 0
    choices_completed: int = 0
    choices_cancelled: int = 0
    """Choices of cancelled requests that had no finish_reason when the client dropped them."""
    finish_reasons: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    completion_tokens: int = 0
    """usage.completion_tokens of the completed requests."""
    unexpected: list[str] = field(default_factory=list)
    misanswered: list[str] = field(default_factory=list)

    def error_codes(self) -> Counter:
        """Errors by error code alone (what the server's failure counter is labelled by)."""
        codes: Counter = Counter()
        for key, count in self.errors.items():
            codes[key.split(" ", 1)[1]] += count
        return codes

    def as_dict(self) -> dict:
        return {
            "sent": self.sent,
            "invalid_sent": self.invalid_sent,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "errors": sum(self.errors.values()),
            "errors_by_status": dict(sorted(self.errors.items())),
            "unexpected": len(self.unexpected),
            "unexpected_examples": self.unexpected[:10],
            "misanswered": len(self.misanswered),
            "misanswered_examples": self.misanswered[:10],
            "choices_completed": self.choices_completed,
            "choices_cancelled": self.choices_cancelled,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "completion_tokens": self.completion_tokens,
        }


async def send(client: httpx.AsyncClient, base_url: str, model: str, request: PlannedRequest,
               tally: ClientTally) -> None:
    """Send one planned request and count its outcome in `tally`."""
    tally.sent += 1
    tally.invalid_sent += request.invalid is not None
    if isinstance(request.body, bytes):
        kwargs: dict = {"content": request.body, "headers": {"content-type": "application/json"}}
    else:
        body = request.body if "model" in request.body else {"model": model, **request.body}
        kwargs = {"json": body}
    url = base_url + request.path
    try:
        if request.stream:
            async with client.stream("POST", url, **kwargs) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    _count_error(request, resp, tally)
                    return
                await _read_stream(request, resp, tally)
        else:
            resp = await client.post(url, **kwargs)
            if resp.status_code != 200:
                _count_error(request, resp, tally)
                return
            _count_answer(request, resp.json(), tally)
    except (httpx.HTTPError, ValueError) as err:
        tally.unexpected.append(f"#{request.index}: {type(err).__name__}: {err}"[:300])


def _count_error(request: PlannedRequest, resp: httpx.Response, tally: ClientTally) -> None:
    try:
        code = resp.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "not-openai-format"
    tally.errors[f"{resp.status_code} {code}"] += 1
    if request.invalid is None or EXPECTED_ERRORS[request.invalid] != (resp.status_code, code):
        tally.misanswered.append(f"#{request.index} ({request.invalid or 'valid'}): {resp.status_code} {resp.text[:200]}")


def _count_answer(request: PlannedRequest, answer: dict, tally: ClientTally) -> None:
    if request.invalid is not None:
        tally.unexpected.append(f"#{request.index} ({request.invalid}): answered 200")
        return
    reasons = [choice.get("finish_reason") for choice in answer.get("choices", [])]
    _count_finished(request, reasons, answer.get("usage") or {}, tally)


def _count_finished(request: PlannedRequest, reasons: list, usage: dict, tally: ClientTally) -> None:
    if len(reasons) != request.choices or not all(reasons):
        tally.unexpected.append(f"#{request.index}: finish reasons {reasons}, {request.choices} choices")
        return
    tally.completed += 1
    tally.choices_completed += len(reasons)
    tally.finish_reasons.update(reasons)
    tally.completion_tokens += int(usage.get("completion_tokens", 0))


async def _read_stream(request: PlannedRequest, resp: httpx.Response, tally: ClientTally) -> None:
    reasons: dict[int, str] = {}
    usage: dict = {}
    done = False
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        if "error" in event:
            tally.unexpected.append(f"#{request.index}: error event {event['error']}")
            return
        usage = event.get("usage") or usage
        content = False
        for choice in event.get("choices", []):
            if choice.get("finish_reason"):
                reasons[choice["index"]] = choice["finish_reason"]
            content = content or bool(choice.get("text") or (choice.get("delta") or {}).get("content"))
        if request.cancel and content:
            # Leaving the `async with` closes the connection mid-stream: the server aborts.
            tally.cancelled += 1
            tally.choices_cancelled += request.choices - len(reasons)
            tally.finish_reasons.update(reasons.values())
            tally.choices_completed += len(reasons)
            return
    if not done:
        tally.unexpected.append(f"#{request.index}: stream ended without [DONE]")
        return
    _count_finished(request, [reasons.get(i) for i in range(request.choices)], usage, tally)


async def run_clients(client: httpx.AsyncClient, base_url: str, model: str, requests: list[PlannedRequest],
                      clients: int, deadline: float, tally: ClientTally) -> None:
    """`clients` closed-loop clients share `requests` in order; none starts a request after
    `deadline` (time.monotonic())."""
    queue = list(reversed(requests))

    async def worker() -> None:
        while queue and time.monotonic() < deadline:
            await send(client, base_url, model, queue.pop(), tally)

    await asyncio.gather(*(worker() for _ in range(clients)))


# ----------------------------------------------------------------------------- the server's count


def server_counts(before: dict[tuple, float], after: dict[tuple, float]) -> dict:
    """What the server counted between two /metrics scrapes (bench.client.parse_prometheus):
    finished sequences by finish reason, failed HTTP requests by reason, generated tokens, and
    the sequences still running or waiting at the end."""

    def by_label(name: str, label: str) -> Counter:
        counts: Counter = Counter()
        for (metric, labels), value in after.items():
            if metric == name:
                key = dict(labels)[label]
                delta = value - before.get((metric, labels), 0.0)
                if delta:
                    counts[key] += int(round(delta))
        return counts

    def total(name: str) -> float:
        return sum(v for (metric, _), v in after.items() if metric == name)

    def delta(name: str) -> int:
        return int(round(total(name) - sum(v for (metric, _), v in before.items() if metric == name)))

    return {
        "finished": dict(sorted(by_label("eagle_request_success_total", "finished_reason").items())),
        "failures": dict(sorted(by_label("eagle_request_failure_total", "reason").items())),
        "generation_tokens": delta("eagle_generation_tokens_total"),
        "running_at_end": int(total("eagle_num_requests_running")),
        "waiting_at_end": int(total("eagle_num_requests_waiting")),
    }


def reconcile(tally: dict, server: dict) -> list[dict]:
    """The checks that nothing was lost: each {"check", "client", "server", "ok"}. `tally` is
    ClientTally.as_dict() plus "error_codes"; `server` is server_counts()."""
    finished = server["finished"]
    ended = finished.get("stop", 0) + finished.get("length", 0)
    aborted = finished.get("abort", 0)
    other = {k: v for k, v in finished.items() if k not in ("stop", "length", "abort")}
    accepted = tally["choices_completed"] + tally["choices_cancelled"]
    checks = [
        ("sequences accepted = finished on the server (stop + length + abort)",
         accepted, ended + aborted + sum(other.values())),
        ("every abort was a client's cancel (aborts <= cancelled choices)",
         tally["choices_cancelled"], aborted, aborted <= tally["choices_cancelled"]),
        ("choices completed <= finished by stop or length", tally["choices_completed"], ended,
         tally["choices_completed"] <= ended),
        ("errors by code = the server's failures by reason", tally["error_codes"], server["failures"]),
        ("unexpected outcomes on the client", tally["unexpected"], 0),
        ("HTTP errors = the invalid requests sent, each with its planned status and code",
         tally["invalid_sent"], tally["errors"], tally["errors"] == tally["invalid_sent"] and not tally["misanswered"]),
        ("requests = completed + cancelled + errors + unexpected", tally["sent"],
         tally["completed"] + tally["cancelled"] + tally["errors"] + tally["unexpected"]),
        ("sequences running or waiting at the end", 0, server["running_at_end"] + server["waiting_at_end"]),
    ]
    rows = []
    for check in checks:
        name, client, srv = check[:3]
        ok = check[3] if len(check) > 3 else client == srv
        rows.append({"check": name, "client": client, "server": srv, "ok": bool(ok)})
    return rows


# ----------------------------------------------------------------------------- memory


def rss_mb(pid: int) -> float | None:
    """VmRSS of process `pid` in MB (2**20 bytes), from /proc; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """The process ids below `pid` (children, their children, ...), from /proc."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def sample(pid: int, started: float, done: int) -> dict:
    """One memory sample: seconds since `started`, requests done, the server's RSS and the sum
    of its descendants' RSS (MB)."""
    children = [rss_mb(c) for c in descendants(pid)]
    rss = rss_mb(pid)
    return {"t_s": round(time.monotonic() - started, 1), "requests_done": done,
            "rss_mb": None if rss is None else round(rss, 1),
            "children_rss_mb": round(sum(c for c in children if c is not None), 1)}


def rss_summary(samples: list[dict], window: int) -> dict:
    """The RSS curve by requests done: the RSS when each multiple of `window` requests was first
    reached (from the samples, which carry "requests_done" and "rss_mb"), the growth over each
    window, and start (first sample), end (last), peak. Growth over the last half of the
    requests says whether the curve has flattened."""
    points = [s for s in samples if s.get("rss_mb") is not None]
    if not points:
        return {"start_mb": None, "end_mb": None, "peak_mb": None, "by_requests": [], "window": window}
    marks = []
    target = 0
    last_done = points[-1]["requests_done"]
    for s in points:
        if s["requests_done"] >= target:
            marks.append({"requests": s["requests_done"], "t_s": s["t_s"], "rss_mb": s["rss_mb"]})
            target = (s["requests_done"] // window + 1) * window
    if marks[-1]["requests"] != last_done or marks[-1]["rss_mb"] != points[-1]["rss_mb"]:
        marks.append({"requests": last_done, "t_s": points[-1]["t_s"], "rss_mb": points[-1]["rss_mb"]})
    for prev, mark in zip(marks, marks[1:]):
        mark["growth_mb"] = round(mark["rss_mb"] - prev["rss_mb"], 1)
    half = next((s for s in points if s["requests_done"] >= last_done / 2), points[-1])
    return {
        "window": window,
        "start_mb": points[0]["rss_mb"],
        "end_mb": points[-1]["rss_mb"],
        "peak_mb": max(s["rss_mb"] for s in points),
        "growth_mb": round(points[-1]["rss_mb"] - points[0]["rss_mb"], 1),
        "second_half_growth_mb": round(points[-1]["rss_mb"] - half["rss_mb"], 1),
        "by_requests": marks,
    }


async def sample_memory(pid: int, started: float, every_s: float, tally: ClientTally, samples: list[dict],
                        stop: asyncio.Event) -> None:
    """Append a sample every `every_s` until `stop` is set."""
    while not stop.is_set():
        samples.append(sample(pid, started, _done(tally)))
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
            pass


def _done(tally: ClientTally) -> int:
    return tally.completed + tally.cancelled + sum(tally.errors.values()) + len(tally.unexpected)


# ----------------------------------------------------------------------------- the run


async def scrape(client: httpx.AsyncClient, base_url: str) -> dict[tuple, float]:
    resp = await client.get(f"{base_url}/metrics", timeout=30)
    resp.raise_for_status()
    return parse_prometheus(resp.text)


async def settled_metrics(client: httpx.AsyncClient, base_url: str, timeout_s: float = 30) -> dict[tuple, float]:
    """/metrics once nothing runs or waits and the finished count has stopped moving (the
    aborts of the last cancelled streams land a step after the disconnect)."""
    deadline = time.monotonic() + timeout_s
    previous = None
    while True:
        metrics = await scrape(client, base_url)
        counts = server_counts({}, metrics)
        key = (counts["finished"], counts["running_at_end"], counts["waiting_at_end"])
        if (key == previous and not counts["running_at_end"] and not counts["waiting_at_end"]) \
                or time.monotonic() > deadline:
            return metrics
        previous = key
        await asyncio.sleep(1.0)


async def soak(args: argparse.Namespace, launch: Launch, logs: Path) -> dict:
    """Start the server, warm it up, run the soak, stop the server; the result's body."""
    server = PeerProcess(launch, logs / "server.log")
    tally = ClientTally()
    samples: list[dict] = []
    requests = plan(args.requests, prompt_texts(), args.seed, tuple(args.max_tokens))
    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4)
    async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=httpx.Timeout(600.0)) as client:
        launched = time.monotonic()
        log(f"starting on :{server.port}: {server.command}")
        server.start()
        stop = asyncio.Event()
        try:
            assert server.proc is not None
            pid = server.proc.pid
            startup: list[dict] = []
            sampler = asyncio.create_task(sample_memory(pid, launched, args.sample_seconds, tally, startup, stop))
            model = await server.wait_ready(client, args.startup_timeout)
            ready_s = time.monotonic() - launched
            log(f"ready after {ready_s:.0f} s (model {model!r}); warming up")
            for warm in plan(args.warmup, prompt_texts(), args.seed + 1, tuple(args.max_tokens)):
                await send(client, server.base_url, model, warm, ClientTally())
            stop.set()
            await sampler
            before = await settled_metrics(client, server.base_url)
            stop = asyncio.Event()
            started = time.monotonic()
            sampler = asyncio.create_task(sample_memory(pid, started, args.sample_seconds, tally, samples, stop))
            deadline = started + args.max_seconds
            log(f"soak: {len(requests)} requests, {args.clients} clients, at most {args.max_seconds:.0f} s")
            progress = asyncio.create_task(_report_progress(tally, samples, len(requests), stop))
            await run_clients(client, server.base_url, model, requests, args.clients, deadline, tally)
            duration_s = time.monotonic() - started
            after = await settled_metrics(client, server.base_url)
            stop.set()
            await asyncio.gather(sampler, progress)
            samples.append(sample(pid, started, _done(tally)))
        finally:
            stop.set()
            server.stop()
    client_counts = {**tally.as_dict(), "error_codes": dict(sorted(tally.error_codes().items()))}
    server_side = server_counts(before, after)
    checks = reconcile(client_counts, server_side)
    return {
        "server": {"command": server.command, "model_id": model, "ready_s": round(ready_s, 1),
                   "log": str(server.log_path), "startup_rss": startup},
        "duration_s": round(duration_s, 1),
        "stopped_by_deadline": tally.sent < len(requests),
        "requests_per_s": round(tally.sent / duration_s, 2) if duration_s else None,
        "client": client_counts,
        "server_counts": server_side,
        "checks": checks,
        "ok": all(c["ok"] for c in checks),
        "rss": rss_summary(samples, args.window),
        "rss_samples": samples,
    }


async def _report_progress(tally: ClientTally, samples: list[dict], total: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 60)
        except asyncio.TimeoutError:
            rss = samples[-1]["rss_mb"] if samples else None
            log(f"{_done(tally)}/{total} done, {tally.cancelled} cancelled, {sum(tally.errors.values())} errors, "
                f"{len(tally.unexpected)} unexpected, RSS {rss} MB")


# ----------------------------------------------------------------------------- results


def markdown(results: dict) -> str:
    machine, settings, client, srv = results["machine"], results["settings"], results["client"], results["server_counts"]
    rss = results["rss"]
    lines = [
        f"# Soak: {machine['name']} ({machine['cpu']}, {machine['cpu_count']} CPUs), {results['started_at'][:10]}",
        "",
        f"`{settings['command']}`, commit {settings['revision']}.",
        "",
        f"{client['sent']} requests from {settings['clients']} clients in {results['duration_s']:.0f} s "
        f"({results['requests_per_s']} requests/s), max_tokens {settings['max_tokens'][0]}-{settings['max_tokens'][1]}; "
        f"server ready after {results['server']['ready_s']:.0f} s. Result: **{'ok' if results['ok'] else 'FAILED'}**.",
        "",
        "| client: sent | completed | cancelled | errors | unexpected | completion tokens |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {client['sent']} | {client['completed']} | {client['cancelled']} | {client['errors']} "
        f"| {client['unexpected']} | {client['completion_tokens']} |",
        "",
        f"Client errors by status: {_fmt_counts(client['errors_by_status'])}. Finish reasons seen: "
        f"{_fmt_counts(client['finish_reasons'])}. Server: finished sequences {_fmt_counts(srv['finished'])}, "
        f"failures {_fmt_counts(srv['failures'])}, {srv['generation_tokens']} tokens generated.",
        "",
        "| check | client | server | |",
        "|---|---:|---:|---|",
    ]
    for check in results["checks"]:
        lines.append(f"| {check['check']} | {_fmt_value(check['client'])} | {_fmt_value(check['server'])} "
                     f"| {'ok' if check['ok'] else '**FAILED**'} |")
    lines += [
        "",
        f"Server RSS: {rss['start_mb']} MB at the start of the soak (after {settings['warmup']} warm-up requests), "
        f"{rss['end_mb']} MB at the end, peak {rss['peak_mb']} MB; growth {rss.get('growth_mb')} MB, "
        f"{rss.get('second_half_growth_mb')} MB of it over the second half of the requests.",
        "",
        "| requests done | minutes | RSS MB | growth MB |",
        "|---:|---:|---:|---:|",
    ]
    for mark in rss["by_requests"]:
        lines.append(f"| {mark['requests']} | {mark['t_s'] / 60:.1f} | {mark['rss_mb']} | {mark.get('growth_mb', '')} |")
    return "\n".join(lines) + "\n"


def _fmt_counts(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _fmt_value(value) -> str:
    return _fmt_counts(value) if isinstance(value, dict) else str(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=3000, help="requests of the soak (default: 3000)")
    p.add_argument("--max-seconds", type=float, default=3600,
                   help="no request starts after this many seconds of soak (default: 3600)")
    p.add_argument("--clients", type=int, default=4, help="concurrent closed-loop clients (default: 4)")
    p.add_argument("--max-tokens", type=int, nargs=2, default=[8, 48], metavar=("LOW", "HIGH"),
                   help="max_tokens of each request, drawn from [LOW, HIGH] (default: 8 48)")
    p.add_argument("--warmup", type=int, default=8, help="requests before the soak, not counted (default: 8)")
    p.add_argument("--sample-seconds", type=float, default=5, help="RSS sampling period (default: 5)")
    p.add_argument("--window", type=int, default=300, help="requests per row of the RSS table (default: 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request plan (default: 0)")
    p.add_argument("--model", default="smollm2", help="the server's --model (default: smollm2)")
    p.add_argument("--server-args", default="", help="extra flags for the server, one string")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable for the server (repeatable), e.g. MALLOC_ARENA_MAX=2")
    p.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for the server (default: 900)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output directory")
    p.add_argument("--machine", default=None, help="machine name, appended to the file names")
    args = p.parse_args(argv)
    if args.requests < 1 or args.clients < 1 or not 1 <= args.max_tokens[0] <= args.max_tokens[1]:
        p.error("--requests and --clients must be positive, and 1 <= LOW <= HIGH for --max-tokens")
    if any("=" not in pair for pair in args.env):
        p.error("--env takes NAME=VALUE")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_at = datetime.datetime.now().astimezone()
    env = dict(pair.split("=", 1) for pair in args.env)
    argv_server = [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", "{port}", "--model", args.model,
                   "--log-level", "warning", *shlex.split(args.server_args)]
    launch = Launch("eagle", argv_server, env=env, cwd=REPO_ROOT)
    logs = Path(tempfile.mkdtemp(prefix="soak-bench-logs-"))
    log(f"server log: {logs / 'server.log'}")
    body = asyncio.run(soak(args, launch, logs))
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.update(command=" ".join(["python -m bench.soak", *(argv if argv is not None else sys.argv[1:])]),
                    revision=git_revision(REPO_ROOT))
    results = {"schema": "soak/1", "started_at": started_at.isoformat(timespec="seconds"),
               "machine": environment.machine_info(args.machine), "settings": settings, **body}
    json_path, md_path = environment.write_result_and_markdown(str(args.out), "soak", results, args.machine, markdown)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
