"""IncrementalDetokenizer with a byte-level tokenizer made by hand (token id = one byte)."""

from __future__ import annotations

from eagle_core.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """Token i is the byte i: a multi-byte character spans several tokens, as in byte-level BPE."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def ids(text: str) -> list[int]:
    return list(text.encode())


def detok(*stop: str) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(ByteTokenizer(), [], stop, True)


def test_text_waits_for_a_whole_character():
    d = detok()
    e_acute = ids("é")  # 2 bytes
    assert not d.add(ids(" caf") + e_acute[:1])
    assert d.release(finished=False) == ""  # held back: the step ends inside a character
    d.add(e_acute[1:])
    assert d.release(finished=False) == " café"


def test_a_request_ending_inside_a_character_keeps_the_text_before_it():
    """A speculative step can accept several tokens and end the request on a partial
    character: the whole characters before it are still shown."""
    d = detok()
    d.add(ids(" the caf") + ids("é")[:1])
    assert d.release(finished=True) == " the caf"


def test_stop_string_cuts_the_text():
    d = detok("ab")
    assert not d.add(ids("xxa"))
    assert d.add(ids("bcd"))
    assert d.text == "xx"
    assert d.release(finished=True) == "xx"


def test_a_stop_string_before_min_tokens_is_not_found_later():
    """Text added with find_stop=False (before min_tokens) is never searched again, even for a
    stop string shorter than the longest one (whose length sets how far back a search looks)."""
    d = detok("b", "xyz")
    assert not d.add(ids("ab"), find_stop=False)
    assert not d.add(ids("c"))
    assert d.add(ids("b"))  # a new "b" is found
    assert d.text == "abc"


class PieceTokenizer:
    """Token i is pieces[i], a byte string that may end inside a character, as a byte-level
    BPE token can."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_a_stop_string_is_found_in_the_token_that_ends_it_when_a_character_starts_there():
    """The token carrying a stop string's last character plus the first byte of the next
    character ends the request, not the token that completes that character (after which
    the request might already have ended by length, keeping its tokens past the stop)."""
    e_acute = "é".encode()
    tokenizer = PieceTokenizer([b"xxa", b"b" + e_acute[:1], e_acute[1:] + b"c"])
    d = IncrementalDetokenizer(tokenizer, [], ("ab",), True)
    assert not d.add([0])
    assert d.add([1])
    assert d.text == "xx"
    assert d.release(finished=True) == "xx"


def test_a_partial_character_without_a_stop_string_still_waits():
    e_acute = "é".encode()
    tokenizer = PieceTokenizer([b"xxa", b"b" + e_acute[:1], e_acute[1:] + b"c"])
    d = IncrementalDetokenizer(tokenizer, [], ("zz",), True)
    assert not d.add([0])
    assert not d.add([1])
    assert d.text == "xxa"
    assert not d.add([2])
    assert d.text == "xxabéc"


def test_a_stop_string_before_min_tokens_is_not_cut_when_the_request_ends_in_a_character():
    """Text whose stop string was not to be searched (before min_tokens) stays whole when the
    request ends on a partial character and the held-back text is flushed."""
    e_acute = "é".encode()
    tokenizer = PieceTokenizer([b"xxa", b"b" + e_acute[:1], e_acute[1:] + b"c"])
    d = IncrementalDetokenizer(tokenizer, [], ("ab",), True)
    assert not d.add([0], find_stop=False)
    assert not d.add([1], find_stop=False)
    assert d.release(finished=True) == "xxab"


def test_a_stop_string_before_min_tokens_held_back_with_a_partial_character_is_not_found_later():
    """The text before min_tokens can wait with a partial character; a later token that
    completes the character must not find a stop string that ended before it."""
    e_acute = "é".encode()
    tokenizer = PieceTokenizer([b"ab" + e_acute[:1], e_acute[1:], b"xab"])
    d = IncrementalDetokenizer(tokenizer, [], ("ab",), True)
    assert not d.add([0], find_stop=False)
    assert not d.add([1])  # completes "é": "ab" ended before min_tokens
    assert d.text == "abé"
    assert d.add([2])  # a new "ab" is found
    assert d.text == "abéx"
