"""HTTP routes. Each handler: parse -> check model -> build SamplingParams -> submit -> answer.

Bodies are parsed from raw bytes whatever the Content-Type, so `curl -d '{...}'` without
`-H 'Content-Type: application/json'` works too. Everything that can fail (validation, model
name, queue full, prompt too long) fails before a stream starts, as a plain HTTP error.

Since the routes read raw bodies, FastAPI cannot see their request models: each route declares
its body (`_json_body`) and its answers (`_answers`) for the OpenAPI document (/openapi.json),
and `openapi_components()` gives the request models' schemas that document refers to.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from eagle_core.errors import InvalidRequestError
from server.choices import (
    ChoiceState,
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    sources_out,
    spec_info,
    tool_call_out,
    usage_of,
)
from server.engine_client import EngineClient, RequestStream
from server.errors import APIError, bad_request, model_not_found
from server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from server.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    HealthStatus,
    ModelCard,
    ModelList,
    ResponseMessage,
    SpeculationDebug,
    TokenizeRequest,
    TokenizeResponse,
)
from server.settings import ServerSettings
from server.shutdown import Drain
from server.streaming import StreamMeta, chat_stream, completion_stream
from server.tools import answer, template_has_tools

M = TypeVar("M", bound=BaseModel)

# How often a non-streaming request checks whether its client is still connected.
_DISCONNECT_POLL_S = 0.5

router = APIRouter()


class ClientGone(Exception):
    """The client of a non-streaming request disconnected; nothing is sent back."""


def _client(request: Request) -> EngineClient:
    return request.app.state.engine_client


def _settings(request: Request) -> ServerSettings:
    return request.app.state.settings


def _metrics(request: Request) -> ServerMetrics:
    return request.app.state.metrics


def _drain(request: Request) -> Drain:
    return request.app.state.drain


def served_model_name(request: Request) -> str:
    return _settings(request).served_model_name or _client(request).model_name or "default"


def _check_model(request: Request, name: str | None) -> str:
    """The name echoed back in responses. A request may omit `model` (curl convenience) or use
    the served name or the engine's own model name; anything else is a 404."""
    served = served_model_name(request)
    if name is None or name in (served, _client(request).model_name):
        return served
    raise model_not_found(name)


async def _parse(request: Request, model: type[M]) -> M:
    body = await request.body()
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> APIError:
    """400 naming the first bad parameter, e.g. `messages.0.role`."""
    err = exc.errors()[0]
    # Drop pydantic's union-branch markers ("str", "list[TextPart]") so the path names fields.
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int")]
    param = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        return bad_request(f"Request body is not valid JSON: {err.get('msg')}", None)
    if param is None:  # the body itself, e.g. a JSON array rather than an object
        return bad_request(f"Invalid request body: {err.get('msg')}", None)
    if err.get("type") == "missing":
        return bad_request(f"Missing required parameter: '{param}'", param)
    return bad_request(f"Invalid value for '{param}': {err.get('msg')}", param)


def _token_texts(request: Request) -> TokenTexts:
    # One cache per app: token texts never change while the process lives.
    state = request.app.state
    if getattr(state, "token_texts", None) is None:
        state.token_texts = TokenTexts.of(_client(request).tokenizer)
    return state.token_texts


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def _collect(request: Request, stream: RequestStream, num_choices: int) -> list[ChoiceState]:
    """Gather a whole non-streamed response, aborting if the client disconnects meanwhile. At
    the shutdown deadline DrainMiddleware cancels the handler (server/shutdown.py); the engine
    request is aborted all the same."""
    states = [ChoiceState() for _ in range(num_choices)]

    async def gather() -> None:
        async for i, out in stream:
            states[i].update(out)

    task = asyncio.ensure_future(gather())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                task.result()  # re-raises EngineStepError
                return states
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()
        stream.abort()


def _stream_meta(
    request: Request,
    request_id: str,
    model: str,
    n: int,
    num_choices: int,
    include_usage: bool,
    want_logprobs: bool,
) -> StreamMeta:
    """What an SSE stream needs besides the engine's outputs (chat and completions alike)."""
    return StreamMeta(
        id=request_id,
        created=int(time.time()),
        model=model,
        n=n,
        num_choices=num_choices,
        include_usage=include_usage,
        want_logprobs=want_logprobs,
        token_texts=_token_texts(request) if want_logprobs else None,  # type: ignore[arg-type]
        observer=_metrics(request).stream_observer(num_choices),
    )


# ---------------------------------------------------------------- OpenAPI declarations

# Models FastAPI cannot find in the routes' signatures: the request bodies, and the chunks of
# the event streams.
_REQUEST_MODELS = (ChatCompletionRequest, CompletionRequest, TokenizeRequest)
_CHUNK_MODELS = (ChatCompletionChunk, CompletionChunk)

_ERRORS = {
    400: "Invalid request: a bad parameter (`param` names it), an unsupported feature, malformed JSON",
    401: "Missing or wrong API key (only when the server runs with --api-key)",
    404: "Unknown model (`model_not_found`)",
    413: "Request body over --max-request-bytes",
    429: "The waiting queue is full; Retry-After says when to retry",
    500: "Unexpected server error",
    503: "The model is loading, the server is stopping, or the engine failed",
}

# Which errors each kind of route can answer with: every /v1/* route and /tokenize check the API
# key and readiness; the POST ones also limit the body and validate it.
_GET_API_ERRORS = (401, 404, 500, 503)
_POST_API_ERRORS = (400, 401, 404, 413, 500, 503)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring `model` as the route's JSON body (the route parses it itself)."""
    content = {"application/json": {"schema": _ref(model)}}
    return {"requestBody": {"required": True, "content": content}}


def _event_stream(chunk: type[BaseModel]) -> dict[str, Any]:
    """The text/event-stream media type of a stream of `chunk`s: `itemSchema` (OpenAPI 3.2's
    schema of one event) says each event's data is a chunk, an error, or `[DONE]`."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [_ref(chunk), _ref(ErrorResponse)]},
    }
    return {
        "itemSchema": {
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"anyOf": [{"const": "[DONE]"}, json_data]}},
        }
    }


def _answers(
    ok: type[BaseModel], errors: tuple[int, ...], chunk: type[BaseModel] | None = None
) -> dict[int | str, dict[str, Any]]:
    """`responses` for a route: `ok` as its 200 body (or a stream of `chunk`s, when given, with
    `stream: true`), and `errors`, each in OpenAI's error format."""
    answers: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorResponse, "description": _ERRORS[status]} for status in errors
    }
    answers[200] = {"model": ok, "description": "Success"}
    if chunk is not None:
        answers[200]["description"] = "Success: JSON, or server-sent events with `stream: true`"
        answers[200]["content"] = {"text/event-stream": _event_stream(chunk)}
    return answers


def openapi_components() -> dict[str, dict[str, Any]]:
    """JSON schemas of the request and chunk models (and the models they use), keyed by name,
    for the OpenAPI document's components: the `$ref`s of `_json_body` and `_event_stream`
    point at them."""
    _, defs = models_json_schema(
        [(model, "validation") for model in _REQUEST_MODELS]
        + [(model, "serialization") for model in _CHUNK_MODELS],
        ref_template="#/components/schemas/{model}",
    )
    return defs.get("$defs", {})


# ---------------------------------------------------------------- routes


@router.get(
    "/health",
    responses={
        200: {"model": HealthStatus, "description": "Ready"},
        503: {"model": HealthStatus, "description": "Not ready: loading, failed or stopped"},
        500: {"model": ErrorResponse, "description": _ERRORS[500]},
    },
)
async def health(request: Request) -> Response:
    client = _client(request)
    if client.state == "ready" and not _drain(request).stopping:
        return JSONResponse({"status": "ok"})
    status = "stopping" if client.state == "ready" else client.state
    return JSONResponse(
        {"status": status},  # loading, stopping (draining), failed or stopped
        status_code=503,
        headers={"Retry-After": str(_settings(request).retry_after_s)},
    )


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "Prometheus text format"},
        500: {
            "description": _ERRORS[500],
            "content": {"application/json": {"schema": _ref(ErrorResponse)}},
        },
    },
)
async def metrics(request: Request) -> Response:
    return Response(_metrics(request).render(), media_type=CONTENT_TYPE_LATEST)


def _model_card(request: Request) -> ModelCard:
    """The served model's card; 503 until the engine is ready, as on every /v1/* route, since
    its facts (max_model_len) come from the loaded engine."""
    client = _client(request)
    client.require_ready()
    return ModelCard(
        id=served_model_name(request),
        created=request.app.state.started_at,
        max_model_len=client.max_model_len,
    )


@router.get("/v1/models", responses=_answers(ModelList, _GET_API_ERRORS))
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[_model_card(request)])


@router.get("/v1/models/{model_id:path}", responses=_answers(ModelCard, _GET_API_ERRORS))
async def retrieve_model(request: Request, model_id: str) -> ModelCard:
    """OpenAI's `models.retrieve`: the card of the served name or the engine's own model name
    (the names requests may use), 404 in OpenAI's format for any other."""
    card = _model_card(request)
    _check_model(request, model_id)
    return card


@router.get("/debug/speculation", responses=_answers(SpeculationDebug, _GET_API_ERRORS))
async def speculation(request: Request) -> SpeculationDebug:
    """Why the server drafts what it drafts: the speculation policy's last choice and its cost
    model (also exported as eagle_spec_policy_* metrics)."""
    client = _client(request)
    client.require_ready()
    return SpeculationDebug(policy=client.engine_stats.get("spec_policy"))


@router.post(
    "/tokenize",
    openapi_extra=_json_body(TokenizeRequest),
    responses=_answers(TokenizeResponse, _POST_API_ERRORS),
)
async def tokenize(request: Request) -> TokenizeResponse:
    req = await _parse(request, TokenizeRequest)
    _check_model(request, req.model)
    client = _client(request)
    if req.messages is not None:
        tokens = client.chat_prompt_ids([m.to_template() for m in req.messages])
    elif req.prompt is not None:
        tokens = list(
            client.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        )
    else:
        raise bad_request("Either 'prompt' or 'messages' is required", "prompt")
    return TokenizeResponse(tokens=tokens, count=len(tokens), max_model_len=client.max_model_len)


@router.post(
    "/v1/chat/completions",
    openapi_extra=_json_body(ChatCompletionRequest),
    responses=_answers(ChatCompletionResponse, (*_POST_API_ERRORS, 429), ChatCompletionChunk),
)
async def chat_completions(request: Request) -> Response:
    req = await _parse(request, ChatCompletionRequest)
    model = _check_model(request, req.model)
    params = [req.sampling_params(i) for i in range(req.n)]
    client = _client(request)
    tools, mode = req.tool_list(), req.tool_mode()
    native = template_has_tools(client.tokenizer)
    prompt_ids = client.chat_prompt_ids(
        req.template_messages(native), [t.as_openai() for t in tools] if native and tools else None
    )
    request_id = _new_id("chatcmpl")
    try:
        stream = await client.submit(request_id, [prompt_ids] * req.n, params)
    except InvalidRequestError as exc:
        # The engine speaks of "prompt"; a chat client sent "messages".
        param = "messages" if exc.param == "prompt" else exc.param
        raise InvalidRequestError(exc.message, param, exc.code) from None
    want_logprobs = req.logprobs
    if req.stream:
        meta = _stream_meta(
            request, request_id, model, req.n, req.n, req.include_usage, want_logprobs
        )
        meta.tools, meta.tool_mode = tools, mode
        return chat_stream(stream, meta, _drain(request))
    states = await _collect(request, stream, req.n)
    texts = _token_texts(request) if want_logprobs else None
    choices = []
    for i, s in enumerate(states):
        content, calls, finish_reason = answer(mode, s.text, tools, s.finish_reason)
        choices.append(ChatChoice(
            index=i,
            message=ResponseMessage(content=content, tool_calls=[tool_call_out(c) for c in calls] or None),
            logprobs=chat_logprobs(s.logprobs, texts) if texts else None,
            finish_reason=finish_reason,
            spec_decode=spec_info(s.spec),
            token_sources=sources_out(s.token_sources) if req.token_sources else None,
        ))
    body = ChatCompletionResponse(
        id=request_id, model=model, choices=choices, usage=usage_of(states, req.n)
    )
    return JSONResponse(body.model_dump())


@router.post(
    "/v1/completions",
    openapi_extra=_json_body(CompletionRequest),
    responses=_answers(CompletionResponse, (*_POST_API_ERRORS, 429), CompletionChunk),
)
async def completions(request: Request) -> Response:
    req = await _parse(request, CompletionRequest)
    model = _check_model(request, req.model)
    prompts = req.prompts()
    # Choice index = prompt index * n + sample index (OpenAI's order for batched prompts).
    all_prompts = [p for p in prompts for _ in range(req.n)]
    params = [req.sampling_params(i) for _ in prompts for i in range(req.n)]
    client = _client(request)
    request_id = _new_id("cmpl")
    stream = await client.submit(request_id, all_prompts, params)
    want_logprobs = req.logprobs is not None
    if req.stream:
        meta = _stream_meta(
            request, request_id, model, req.n, len(all_prompts), req.include_usage, want_logprobs
        )
        return completion_stream(stream, meta, _drain(request))
    states = await _collect(request, stream, len(all_prompts))
    texts = _token_texts(request) if want_logprobs else None
    choices = [
        CompletionChoice(
            index=i,
            text=s.text,
            logprobs=completion_logprobs(s.logprobs, texts) if texts else None,
            finish_reason=s.finish_reason,
            spec_decode=spec_info(s.spec),
            token_sources=sources_out(s.token_sources) if req.token_sources else None,
        )
        for i, s in enumerate(states)
    ]
    body = CompletionResponse(
        id=request_id, model=model, choices=choices, usage=usage_of(states, req.n)
    )
    return JSONResponse(body.model_dump())


__all__ = ["ClientGone", "openapi_components", "router", "served_model_name", "validation_error"]
