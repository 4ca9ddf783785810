"""The training prompt sets: deterministic, distinct, ids unique across styles, no evaluation text."""

import re

import pytest

from eagle_core.train.prompts import ID_BASE, make_prompts
from eagle_core.train.rich_prompts import CATEGORIES as RICH_CATEGORIES
from eagle_core.train.rich_prompts import _plural


@pytest.mark.parametrize("style", ["basic", "rich"])
def test_prompts_are_deterministic_and_distinct(style):
    a = make_prompts(800, seed=3, style=style)
    assert a == make_prompts(800, seed=3, style=style)
    assert a != make_prompts(800, seed=4, style=style)
    assert len(a) == 800
    assert len({row["prompt"] for row in a}) == 800
    assert [row["id"] for row in a] == list(range(ID_BASE[style], ID_BASE[style] + 800))


def test_rich_style_covers_every_category_and_never_repeats_basic_prompts():
    rich = make_prompts(2000, style="rich")
    basic = make_prompts(2000, style="basic")
    assert {row["category"] for row in rich} == set(RICH_CATEGORIES)
    # Prompt ids key the captured features, so one work dir can hold both styles' responses.
    assert not {row["id"] for row in rich} & {row["id"] for row in basic}
    assert not {row["prompt"] for row in rich} & {row["prompt"] for row in basic}
    # The rich style is the long-form one.
    mean_words = lambda rows: sum(len(r["prompt"].split()) for r in rows) / len(rows)  # noqa: E731
    assert mean_words(rich) > 1.5 * mean_words(basic)


def test_rich_prompts_have_no_template_leftovers():
    for row in make_prompts(3000, style="rich"):
        text = row["prompt"]
        assert "{" not in text and "}" not in text, text  # an unfilled placeholder
        assert not re.search(r"\b(a|an) (a|an)\b", text), text
    assert _plural("a smart water bottle") == "smart water bottles"


def test_unknown_style_is_an_error():
    with pytest.raises(ValueError, match="prompt style 'fancy'"):
        make_prompts(10, style="fancy")
