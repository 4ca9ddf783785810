"""Logprobs in OpenAI's shapes: `bytes` joined over a text's tokens give its UTF-8, even where a
token holds only part of a character (its decoded text is then U+FFFD); completions'
top_logprobs always hold the sampled token."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from eagle_core.batch import TokenLogprob
from server.choices import TokenTexts, completion_logprobs
from tests.models import IM_END, make_tiny_tokenizer

TEXT = "héllo 😀 世界, ça va"


def test_byte_level_bpe_bytes_rebuild_the_text():
    tokenizer = make_tiny_tokenizer()
    ids = tokenizer(TEXT).input_ids
    texts = TokenTexts.of(tokenizer)
    assert any("\ufffd" in texts(i) for i in ids)  # the case this is for: split characters
    assert b"".join(bytes(texts.bytes(i)) for i in ids) == TEXT.encode()


def test_byte_level_special_tokens_keep_their_text():
    tokenizer = make_tiny_tokenizer()
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    assert bytes(TokenTexts.of(tokenizer).bytes(im_end)) == IM_END.encode()


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece-style: "▁" marks a space, characters outside the vocabulary fall back to
    "<0xNN>" byte entries, as in Llama 2 and Mistral."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("▁", "h", "e", "l", "o", "▁h", "▁he", "▁hel", "▁hell", "▁hello", "a", "c", "v"):
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("▁h", "e"), ("▁he", "l"), ("▁hel", "l"), ("▁hell", "o")]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def test_byte_fallback_bytes_rebuild_the_text():
    tokenizer = byte_fallback_tokenizer()
    text = "hello ça va 😀"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    texts = TokenTexts.of(tokenizer)
    assert texts.bytes(tokenizer.convert_tokens_to_ids("<0xC3>")) == [0xC3]
    # The first token's "▁" is the space SentencePiece adds in front of the text.
    assert b"".join(bytes(texts.bytes(i)) for i in ids) == b" " + text.encode()
    # A token's text is its bytes where they are whole characters: decoding "▁hello" alone
    # strips the space the token adds to a text.
    hello = tokenizer.convert_tokens_to_ids("▁hello")
    assert tokenizer.decode([hello]) == "hello" and texts(hello) == " hello"
    assert all(texts(i).encode() == bytes(texts.bytes(i)) for i in ids if "\ufffd" not in texts(i))


def test_other_tokenizers_take_the_bytes_of_the_decoded_text():
    class CharTokenizer:  # no backend tokenizer: one token per code point
        def decode(self, ids: list[int]) -> str:
            return "".join(chr(i) for i in ids)

    texts = TokenTexts.of(CharTokenizer())
    assert texts.bytes(ord("é")) == list("é".encode())


def test_completion_top_logprobs_hold_the_sampled_token():
    texts = TokenTexts(lambda ids: "".join(chr(i) for i in ids))
    items = [
        TokenLogprob(ord("b"), -2.0, [(ord("a"), -0.5)]),  # sampled below the top 1
        TokenLogprob(ord("a"), -0.5, [(ord("a"), -0.5)]),  # sampled = top 1
        TokenLogprob(ord("c"), -1.0, []),  # logprobs 0
    ]
    out = completion_logprobs(items, texts)
    assert out.top_logprobs == [{"a": -0.5, "b": -2.0}, {"a": -0.5}, {"c": -1.0}]
    assert out.tokens == ["b", "a", "c"] and out.token_logprobs == [-2.0, -0.5, -1.0]


def test_completion_logprobs_name_parts_of_characters_by_their_bytes():
    """Two tokens holding parts of characters both decode to U+FFFD: as one top_logprobs key
    the sampled one's logprob was lost. OpenAI names them "bytes:\\x..", as here."""
    tokenizer = make_tiny_tokenizer()
    texts = TokenTexts.of(tokenizer)
    ids = tokenizer("😀 世界").input_ids
    partial = [i for i in ids if "\ufffd" in texts(i)]
    assert len(set(partial)) >= 2
    first, second = partial[:2]
    whole = next(i for i in tokenizer("hello").input_ids if "\ufffd" not in texts(i))
    items = [TokenLogprob(first, -1.5, [(second, -0.2)]), TokenLogprob(whole, -0.1, [(whole, -0.1)])]
    out = completion_logprobs(items, texts)
    name = "bytes:" + "".join(f"\\x{b:02x}" for b in texts.bytes(first))
    assert out.tokens[0] == name
    assert out.top_logprobs[0] == {name: -1.5, "bytes:" + "".join(f"\\x{b:02x}" for b in texts.bytes(second)): -0.2}
    assert out.tokens[1] == texts(whole)
    assert out.text_offset == [0, 1]  # offsets count the decoded text (U+FFFD is one character)
