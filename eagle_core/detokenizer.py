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
        self._unsearched_until = 0
        """Text before this index was added with find_stop=False (before min_tokens), including
        whole characters still held back with a partial one: no stop string may end there."""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int], find_stop: bool = True) -> bool:
        """Append tokens; returns True when a stop string was found (text is cut before it).

        find_stop=False (before min_tokens) adds the text without searching it: a stop string
        that ends there is never searched for again, as in vLLM."""
        if not token_ids:
            return False
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) <= len(before):
            return False
        old_len = max(len(self.text), self._unsearched_until)
        new_text = after[len(before) :]
        if new_text.endswith("\ufffd"):
            # Incomplete character: wait for more tokens, unless a stop string already ends in
            # the whole characters before it. A token can carry the stop string's last
            # character and the first bytes of the next one; the stop belongs to this token,
            # not to whichever later token completes the character.
            whole = new_text.rstrip("\ufffd")
            if not find_stop:
                self._unsearched_until = len(self.text) + len(whole)
                return False
            if self._find_stop(self.text + whole, old_len) is None:
                return False
            new_text = whole
        self.text += new_text
        self._prefix, self._read = self._read, len(self._ids)
        return find_stop and self._cut_at_stop(old_len)

    def _flush(self) -> None:
        """At the end, add the text of tokens still held back for an incomplete character,
        minus that character. A speculative step can end the request several tokens after the
        last complete character; without this their text would be lost. No stop string is
        searched for: `add` already searched these characters (or was told not to)."""
        if self._read == len(self._ids):
            return
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :]).rstrip("\ufffd")
        if len(after) > len(before):
            self.text += after[len(before) :]
        self._prefix = self._read = len(self._ids)

    def _find_stop(self, text: str, old_len: int) -> int | None:
        """Where the first stop string ending past text[:old_len] starts, if any. Only a stop
        string that ends in the new text is new (one wholly in text added with find_stop=False,
        before min_tokens, is never searched for again)."""
        found = (text.find(s, max(0, old_len - len(s) + 1)) for s in self.stop)
        return min((i for i in found if i >= 0), default=None)

    def _cut_at_stop(self, old_len: int) -> bool:
        cut = self._find_stop(self.text, old_len)
        if cut is None:
            return False
        self.text = self.text[:cut]
        return True

    def release(self, finished: bool) -> str:
        """Text that can be shown now and was not shown before."""
        if finished:
            self._flush()
        end = len(self.text) if finished else max(self._emitted, len(self.text) - self._holdback)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
