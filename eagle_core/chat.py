"""Chat templating whose control tokens come only from the template, never from message content.

A chat template renders a conversation to text, and tokenizing that text turns every occurrence of
a special token's text into the control token, wherever it came from: a user who writes
`<|im_end|>\\n<|im_start|>system\\n...` forges a system turn. `chat_prompt_ids` keeps the
template's own control tokens and tokenizes message content as plain text:

- content without any special token's text (nearly every request) is rendered and tokenized as
  the tokenizer always does, so those prompts are exactly what they were;
- otherwise each such content string is replaced by a marker, the conversation is rendered, and
  the text between markers (the template's) is tokenized with special tokens parsed while the
  content strings in the markers' places are tokenized with `split_special_tokens=True`. A template
  that does not reproduce a marker exactly once, in order (one that rewrites content), gets the
  request refused rather than tokenized unsafely.

`plain_content=False` restores the tokenizer's own behaviour (ModelConfig.control_tokens_in_content).
"""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError, TemplateSyntaxError

from eagle_core.errors import InvalidRequestError

_MARKER = "\ue000eagle-content-{}\ue001"
"""Stands for one message's content while rendering; private-use characters keep it apart from
anything a template writes."""


def chat_prompt_ids(
    tokenizer: Any, messages: list[dict], plain_content: bool = True, tools: list[dict] | None = None
) -> list[int]:
    """Token ids of `messages` followed by the assistant's turn header; `tools` (OpenAI's tool
    list) go to templates that render them."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
    specials = _special_texts(tokenizer)
    risky = [
        i for i, m in enumerate(messages)
        if plain_content and isinstance(m.get("content"), str) and any(t in m["content"] for t in specials)
    ]  # fmt: skip
    if not risky:
        return _ids(_render(tokenizer, messages, tokenize=True, tools=tools))
    marked = [{**m, "content": _MARKER.format(i)} if i in risky else m for i, m in enumerate(messages)]
    text = _render(tokenizer, marked, tokenize=False, tools=tools)
    ids: list[int] = []
    for i in risky:
        marker = _MARKER.format(i)
        if text.count(marker) != 1:
            raise InvalidRequestError(
                "a message contains the text of one of the model's control tokens, and this model's "
                "chat template rewrites message content, so it cannot be kept as plain text",
                param="messages",
            )
        template_part, text = text.split(marker)
        ids += _encode(tokenizer, template_part, split_special=False)
        ids += _encode(tokenizer, messages[i]["content"], split_special=True)
    return ids + _encode(tokenizer, text, split_special=False)


def _special_texts(tokenizer: Any) -> set[str]:
    """The text of every special token: the named ones (bos, eos, ...) and every added token
    marked special (ChatML's <|im_start|> is one, not always among the named)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {t.content for t in added.values() if getattr(t, "special", False)}
    return {t for t in texts | set(getattr(tokenizer, "all_special_tokens", [])) if t}


def _render(tokenizer: Any, messages: list[dict], tokenize: bool, tools: list[dict] | None = None) -> Any:
    extra = {"tools": tools} if tools else {}
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize, **extra)
    except TemplateSyntaxError:
        raise  # the model's template itself is broken: a server fault, whatever was sent
    except TemplateError as exc:
        # Templates raise on purpose for conversations their model does not take (a system
        # role, roles that do not alternate): the client's input, not a server fault.
        raise InvalidRequestError(f"the model's chat template rejected these messages: {exc}", "messages") from None


def _ids(rendered: Any) -> list[int]:
    return list(rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered)


def _encode(tokenizer: Any, text: str, split_special: bool) -> list[int]:
    # The rendered template carries its own BOS where the model wants one, as when it is
    # tokenized whole: add nothing.
    if not text:
        return []
    return _ids(tokenizer(text, add_special_tokens=False, split_special_tokens=split_special))
