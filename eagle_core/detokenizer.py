"""Incremental detokenization and stop-string handling for one request."""

from __future__ import annotations

# Prompt tokens kept as left context so the first output tokens decode with their leading
# spaces (SentencePiece tokenizers drop a leading space at the start of a decode).
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Turns a growing list of token ids into valid UTF-8 text deltas.

    Decodes only a short window: text(ids[prefix:]) minus text(ids[prefix:read]) is the new
    text, held back while it ends in an incomplete UTF-8 sequence (U+FFFD). Stop strings are
    searched in the accumulated text; the last len(longest stop) - 1 characters are held back
    so that no part of a stop string is ever emitted.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: tuple[str, ...], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""
        """All output text decoded so far (cut at a stop string once one is found)."""
        self._emitted = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> bool:
        """Append tokens; returns True when a stop string was found (text is cut before it)."""
        if not token_ids:
            return False
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False  # incomplete character: wait for more tokens
        old_len = len(self.text)
        self.text += after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        return self._cut_at_stop(old_len)

    def _cut_at_stop(self, old_len: int) -> bool:
        if not self.stop:
            return False
        window_start = max(0, old_len - self._holdback)
        hits = [i for i in (self.text.find(s, window_start) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        return True

    def release(self, finished: bool) -> str:
        """Text that can be shown now and was not shown before."""
        end = len(self.text) if finished else max(self._emitted, len(self.text) - self._holdback)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
