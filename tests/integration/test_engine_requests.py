"""Request handling in the engine: seeds, stops, aborts, bad input."""

from __future__ import annotations

import pytest
from jinja2 import TemplateSyntaxError

from eagle_core import InvalidRequestError, ModelConfig, ModelLoadError, SamplingParams
from eagle_core.worker.loader import load_model
from tests.engine_helpers import make_engine, random_prompts
from tests.models import TINY_VOCAB_SIZE


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return make_engine(tiny_llama_dir)


def run(engine, requests: dict[str, tuple[list[int] | str, SamplingParams]]) -> dict:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    done = {rid: {"tokens": [], "text": "", "reason": None} for rid in requests}
    while engine.has_unfinished():
        for out in engine.step():
            entry = done[out.request_id]
            entry["tokens"] += out.new_token_ids
            entry["text"] += out.new_text
            if out.finished:
                entry["reason"] = out.finish_reason
    return done


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(engine):
    prompt = random_prompts(5, [12], TINY_VOCAB_SIZE)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=30, ignore_eos=True)
    alone = run(engine, {"a": (prompt, params)})["a"]["tokens"]
    others = {
        f"o{i}": (p, SamplingParams(temperature=1.0, seed=i, max_tokens=25, ignore_eos=True))
        for i, p in enumerate(random_prompts(6, [3, 30, 7, 15, 60], TINY_VOCAB_SIZE))
    }
    batched = run(engine, {**others, "a": (prompt, params)})["a"]["tokens"]
    assert batched == alone
    different_seed = run(engine, {"b": (prompt, SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=30, ignore_eos=True))})
    assert different_seed["b"]["tokens"] != alone


def test_stop_string_cuts_text_and_nothing_after_it_is_emitted(engine):
    prompt = random_prompts(7, [10], TINY_VOCAB_SIZE)[0]
    free = run(engine, {"f": (prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))})["f"]
    text = free["text"]
    assert len(text) > 12
    stop = text[8:11]
    first = text.find(stop)
    stopped = run(engine, {"s": (prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))})["s"]
    assert stopped["reason"] == "stop"
    assert stopped["text"] == text[:first]


def test_stop_token_id_and_length(engine):
    prompt = random_prompts(8, [10], TINY_VOCAB_SIZE)[0]
    free = run(engine, {"f": (prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))})["f"]
    assert free["reason"] == "length" and len(free["tokens"]) == 20
    stop_id = free["tokens"][5]
    cut = free["tokens"].index(stop_id)
    stopped = run(engine, {"s": (prompt, SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_id]))})["s"]
    assert stopped["reason"] == "stop"
    assert stopped["tokens"] == free["tokens"][:cut]


def test_abort_frees_kv_and_reports(engine):
    prompts = random_prompts(9, [20, 20], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    engine.add_request("x", prompts[0], params)
    engine.add_request("y", prompts[1], params)
    engine.step()
    engine.step()
    engine.abort("x")
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "x"]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "abort"
    assert engine.num_running == 1
    while engine.has_unfinished():
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prompt_longer_than_context_is_rejected(tiny_llama_dir):
    small = make_engine(tiny_llama_dir, max_model_len=64)
    with pytest.raises(InvalidRequestError) as info:
        small.add_request("long", list(range(4, 70)), SamplingParams(max_tokens=1))
    assert info.value.param == "prompt" and "64" in info.value.message
    assert small.num_waiting == 0


def test_bad_sampling_values_are_rejected_with_the_parameter_named():
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(max_tokens=0)
    assert info.value.param == "max_tokens"
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(temperature=-1)
    assert info.value.param == "temperature"


def test_unknown_model_path_fails_with_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelConfig(model=str(missing)))
    assert str(missing) in str(info.value)


def test_text_prompt_and_chat_template(engine):
    ids = engine.apply_chat_template([{"role": "user", "content": "hello there"}])
    assert ids and isinstance(ids[0], int)
    done = run(engine, {"t": ("hello world", SamplingParams(temperature=0, max_tokens=5)), "c": (ids, SamplingParams(temperature=0, max_tokens=5))})
    assert all(entry["reason"] in ("stop", "length") for entry in done.values())


def test_offline_llm_takes_one_sampling_params_per_prompt(tiny_llama_dir):
    from eagle_core import LLM

    llm = LLM(model=str(tiny_llama_dir), dtype="float32", draft=None)
    prompt = random_prompts(7, [10], TINY_VOCAB_SIZE)[0]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=12, ignore_eos=True) for s in (1, 2, 1)]
    outs = llm.generate([prompt] * 3, params)
    alone = [llm.generate([prompt], p)[0].token_ids for p in params]
    assert [o.token_ids for o in outs] == alone
    assert outs[0].token_ids == outs[2].token_ids != outs[1].token_ids
    assert [len(o.token_ids) for o in llm.generate([prompt] * 2, [params[0], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)])] == [12, 3]
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate([prompt] * 3, params[:2])


def test_a_chat_template_that_refuses_the_messages_is_a_client_error(engine, monkeypatch):
    """Templates raise on purpose for conversations their model does not take (Gemma's "System
    role not supported"): a 400 naming `messages`, not a server error."""
    refusing = "{{ raise_exception('System role not supported') }}"
    monkeypatch.setattr(engine.worker.tokenizer, "chat_template", refusing, raising=False)
    with pytest.raises(InvalidRequestError, match="System role not supported") as err:
        engine.apply_chat_template([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
    assert err.value.param == "messages"
    # A template that does not even compile is the server's fault, not a 400 blaming messages.
    monkeypatch.setattr(engine.worker.tokenizer, "chat_template", "{% if %}", raising=False)
    with pytest.raises(TemplateSyntaxError):
        engine.apply_chat_template([{"role": "user", "content": "y"}])
