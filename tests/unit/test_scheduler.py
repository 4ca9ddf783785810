"""The scheduler with hand-made worker results: budgets, chunking, preemption, speculation slots."""

from __future__ import annotations

from eagle_core.batch import SeqResult, StepResult
from eagle_core.config import SchedulerConfig
from eagle_core.kv import BlockManager
from eagle_core.request import Request, RequestStatus
from eagle_core.sampling_params import SamplingParams
from eagle_core.scheduler import Scheduler
from eagle_core.spec.policy import Choice

GREEDY = SamplingParams(temperature=0, max_tokens=100)


def make(num_blocks=64, block_size=4, draft_slots=0, max_spec_batch=0, lookup_slots=0, max_lookup_batch=0,
         caching=False, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size, caching), draft_slots,
                     max_spec_batch, lookup_slots, max_lookup_batch)


def request(rid: str, prompt_len: int, max_output: int = 100, eos=frozenset()) -> Request:
    return Request(rid, list(range(10, 10 + prompt_len)), GREEDY, max_output, eos)


def step(scheduler: Scheduler, token=7, accepted=0):
    """Schedule, then answer every sampling sequence with `accepted` drafts + one bonus token."""
    batch = scheduler.schedule()
    results = {
        w.request_id: SeqResult(w.request_id, [token] * (1 + min(accepted, w.num_draft_slots)),
                                num_draft_tokens=w.num_draft_slots, num_accepted_tokens=min(accepted, w.num_draft_slots))
        for w in batch.seqs if w.sample
    }
    return batch, scheduler.update(batch, StepResult(results))


def test_long_prompt_is_chunked_under_the_token_budget():
    s = make(max_num_batched_tokens=8)
    s.add(request("a", 20))
    sizes = []
    for _ in range(3):
        batch, news = step(s)
        sizes.append(len(batch.seqs[0].token_ids))
    assert sizes == [8, 8, 4]
    assert news and news[0][1] == [7]  # the last chunk sampled the first token
    batch, _ = step(s)
    assert batch.seqs[0].token_ids == [7] and batch.seqs[0].start_pos == 20


def test_decoding_sequences_come_first_and_prefill_fills_the_rest():
    s = make(max_num_batched_tokens=10)
    s.add(request("a", 4))
    step(s)
    s.add(request("b", 30))
    batch, _ = step(s)
    assert [(w.request_id, len(w.token_ids)) for w in batch.seqs] == [("a", 1), ("b", 9)]


def test_max_num_seqs_limits_admission():
    s = make(max_num_seqs=2)
    for rid in "abc":
        s.add(request(rid, 3))
    batch, _ = step(s)
    assert [w.request_id for w in batch.seqs] == ["a", "b"] and s.num_waiting == 1


def test_out_of_blocks_preempts_the_newest_and_recomputes_it_later():
    s = make(num_blocks=4, block_size=4)  # 16 tokens of KV in all
    s.add(request("old", 6))
    s.add(request("new", 6))
    step(s)  # both prefilled: 2 blocks each, all 4 used
    for _ in range(2):
        step(s)  # old reaches 8 tokens -> needs a 3rd block at the next growth
    batch, _ = step(s)
    assert s.num_preemptions == 1
    new = s.requests["new"]
    assert new.status is RequestStatus.WAITING and new.num_computed_tokens == 0 and not new.block_table
    assert [w.request_id for w in batch.seqs] == ["old"]
    # once old finishes, new is recomputed: its prompt and output so far are prefilled again
    s.finish("old", "stop")
    known = new.prompt_token_ids + new.output_token_ids
    batch, _ = step(s)
    work = batch.seqs[0]
    assert work.request_id == "new" and work.start_pos == 0
    assert work.token_ids == known
    assert work.sample  # the recompute ends at the last known token and samples the next


def test_draft_slots_are_reserved_and_capped_by_room_and_budget():
    s = make(draft_slots=5, max_num_batched_tokens=64)
    s.add(request("a", 4, max_output=4))
    step(s)  # prefill, first token
    batch, _ = step(s)
    # 1 output so far, cap 4: at most 4 - 1 - 1 = 2 drafts can still be useful
    assert batch.seqs[0].num_draft_slots == 2
    blocks = s.requests["a"].block_table
    assert len(blocks) * 4 >= 5 + 1 + 2


def test_draft_slots_never_preempt_and_take_what_kv_is_left():
    """Out of KV blocks, a decoding sequence gets its own token and only the draft slots that
    free blocks or its own blocks hold; no sequence is preempted (and recomputed) for drafts."""
    s = make(num_blocks=5, block_size=4, draft_slots=4)
    s.add(request("a", 7))
    s.add(request("b", 8))
    step(s)  # prefills: 2 blocks each, one block free
    batch, _ = step(s)
    # a's root (position 7) fits its 2nd block; b's (position 8) needs the free block, which a's
    # drafts must not take first. a gets no drafts, b the 3 slots left in its new block.
    assert [(w.request_id, w.num_draft_slots, w.draft_skip_reason) for w in batch.seqs] == [
        ("a", 0, "kv_cache"), ("b", 3, None)]  # fmt: skip
    assert s.num_preemptions == 0 and s.blocks.num_free_blocks == 0
    s = make(num_blocks=5, block_size=4, draft_slots=4)
    s.add(request("a", 7))
    s.add(request("b", 7))
    step(s)
    batch, _ = step(s)  # both roots fit the blocks held: a's drafts take the free block
    assert [(w.num_draft_slots, w.draft_skip_reason) for w in batch.seqs] == [(4, None), (0, "kv_cache")]
    assert s.num_preemptions == 0


def test_accepted_drafts_advance_the_kv_length():
    s = make(draft_slots=4)
    s.add(request("a", 4))
    step(s)
    req = s.requests["a"]
    assert req.num_computed_tokens == 4 and req.num_output_tokens == 1
    step(s, accepted=3)
    # root + 3 accepted drafts are in KV; the bonus token is not yet
    assert req.num_computed_tokens == 8 and req.num_output_tokens == 5
    assert req.num_computed_tokens == req.num_tokens - 1


def test_eos_inside_an_accepted_run_cuts_it_there():
    s = make(draft_slots=4)
    s.add(request("a", 4, eos=frozenset({99})))
    step(s)
    batch = s.schedule()
    result = SeqResult("a", [5, 6, 99, 8], num_draft_tokens=4, num_accepted_tokens=3)
    (req, appended), = s.update(batch, StepResult({"a": result}))
    assert appended == [5, 6] and req.finish_reason == "stop" and req.is_finished
    assert s.blocks.num_free_blocks == s.blocks.num_blocks


def test_length_cap_inside_an_accepted_run():
    s = make(draft_slots=4)
    s.add(request("a", 4, max_output=3))
    step(s)
    batch = s.schedule()
    (req, appended), = s.update(batch, StepResult({"a": SeqResult("a", [5, 6, 7], num_accepted_tokens=2)}))
    assert appended == [5, 6] and req.finish_reason == "length" and req.num_output_tokens == 3


def test_abort_frees_blocks_and_tells_the_worker():
    s = make()
    s.add(request("a", 9))
    step(s)
    s.finish("a", "abort")
    assert s.blocks.num_free_blocks == s.blocks.num_blocks
    assert s.schedule().finished_request_ids == ["a"]


def test_past_max_spec_batch_steps_decode_without_trees():
    s = make(draft_slots=4, max_spec_batch=2)
    for rid in "ab":
        s.add(request(rid, 3))
    step(s)
    batch, _ = step(s)
    assert [w.num_draft_slots for w in batch.seqs] == [4, 4]
    s.add(request("c", 3))
    step(s)  # c prefills; three sequences now run
    batch, _ = step(s)
    assert [w.num_draft_slots for w in batch.seqs] == [0, 0, 0]
    assert {w.draft_skip_reason for w in batch.seqs} == {"batch_size"}
    s.finish("c", "stop")
    batch, _ = step(s)
    assert [w.num_draft_slots for w in batch.seqs] == [4, 4]


def test_skip_reasons_for_length_and_budget():
    s = make(draft_slots=4, max_num_batched_tokens=64)
    s.add(request("a", 3, max_output=2))
    step(s)
    batch, _ = step(s)
    assert batch.seqs[0].num_draft_slots == 0 and batch.seqs[0].draft_skip_reason == "length_cap"


def test_lookup_slots_take_only_the_budget_prefills_leave():
    s = make(draft_slots=2, lookup_slots=8, max_num_batched_tokens=16)
    s.add(request("a", 4))
    step(s)
    batch, _ = step(s)
    assert batch.seqs[0].num_draft_slots == 2 + 8  # nothing waits: tree and lookup slots
    s.add(request("b", 12))
    batch, _ = step(s)
    # a's tree (1 + 2) first, then b's whole prompt (12); only the last token is left for lookup
    assert [(w.request_id, len(w.token_ids), w.num_draft_slots) for w in batch.seqs] == [("a", 1, 3), ("b", 12, 0)]
    assert len(s.requests["a"].block_table) * 4 >= batch.seqs[0].start_pos + 1 + 3


def test_a_prompts_tokens_come_before_draft_slots():
    s = make(draft_slots=4, max_num_batched_tokens=16)
    s.add(request("a", 4))
    step(s)
    s.add(request("b", 20))
    batch, _ = step(s)
    # b's chunk takes all the budget a's decode token leaves: a tree there would push 4 prompt
    # tokens into another step
    assert [(w.request_id, len(w.token_ids), w.num_draft_slots) for w in batch.seqs] == [("a", 1, 0), ("b", 15, 0)]
    assert batch.seqs[0].draft_skip_reason == "token_budget"
    batch, _ = step(s)
    # b's last 5 prompt tokens leave room for a's whole tree
    assert [(w.request_id, len(w.token_ids), w.num_draft_slots) for w in batch.seqs] == [("a", 1, 4), ("b", 5, 0)]


def test_lookup_slots_are_capped_by_room_and_never_preempt():
    s = make(draft_slots=2, lookup_slots=8, max_num_batched_tokens=64)
    s.add(request("a", 4, max_output=6))
    step(s)
    batch, _ = step(s)
    assert batch.seqs[0].num_draft_slots == 6 - 1 - 1  # room for 4 drafts: 2 tree + 2 lookup
    s = make(num_blocks=4, draft_slots=2, lookup_slots=8, max_num_batched_tokens=64)
    s.add(request("a", 5))
    s.add(request("b", 2))
    step(s)  # prefills: a holds 2 blocks, b 1, one is free
    batch, _ = step(s)
    # a's root + tree fill its 2 blocks; b's take the free block; lookup gets what is left in
    # the blocks each holds, and no one is preempted for it
    assert [w.num_draft_slots for w in batch.seqs] == [2, 2 + 3]
    assert s.num_preemptions == 0 and s.blocks.num_free_blocks == 0


def test_above_max_spec_batch_decode_steps_get_lookup_slots_up_to_max_lookup_batch():
    s = make(draft_slots=4, max_spec_batch=1, lookup_slots=6, max_lookup_batch=2, max_num_batched_tokens=64)
    for rid in "abc":
        s.add(request(rid, 3))
    step(s)
    batch, _ = step(s)  # three run: past both limits, plain decoding
    assert [(w.num_draft_slots, w.draft_skip_reason) for w in batch.seqs] == [(0, "batch_size")] * 3
    s.finish("c", "stop")
    batch, _ = step(s)  # two run: lookup alone
    assert [(w.num_draft_slots, w.draft_skip_reason, w.drafts_with_head) for w in batch.seqs] == [
        (6, "batch_size", False), (6, "batch_size", False)
    ]
    s.finish("b", "stop")
    batch, _ = step(s)
    assert (batch.seqs[0].num_draft_slots, batch.seqs[0].drafts_with_head) == (4 + 6, True)


class _Recording:
    """A policy that lets nobody draft and remembers what each step asked it."""

    decides_lookup = True

    def __init__(self):
        self.asked: list[tuple[list[str], int]] = []

    def choose(self, candidates, other_rows=0):
        self.asked.append(([c.request_id for c in candidates], other_rows))
        return Choice(frozenset(), frozenset(), 0.0)

    def admit(self, request_id, start):
        pass

    def drop(self, request_id):
        pass


def test_the_policy_is_told_of_the_prefill_rows_the_step_will_admit():
    policy = _Recording()
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64), BlockManager(64, 4), num_draft_slots=4,
                          policy=policy)
    scheduler.add(request("a", 5))
    step(scheduler)  # a's prefill: nothing decodes yet
    assert policy.asked[-1] == ([], 5)
    scheduler.add(request("b", 12))
    batch, _ = step(scheduler)
    assert policy.asked[-1] == (["a"], 12)  # b is admitted in the same step
    assert [len(w.token_ids) for w in batch.seqs] == [1, 12]
    assert batch.seqs[0].draft_skip_reason == "policy"


class _Sized(_Recording):
    """A policy that lets everyone draft trees of `tree_nodes` nodes."""

    def __init__(self, tree_nodes):
        super().__init__()
        self.tree_nodes = tree_nodes

    def choose(self, candidates, other_rows=0):
        return Choice(frozenset(c.request_id for c in candidates), frozenset(), 0.0, tree_nodes=self.tree_nodes)


def test_the_policys_tree_size_sets_the_tree_slots_and_lookup_slots_come_on_top():
    policy = _Sized(3)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64), BlockManager(64, 4), num_draft_slots=7,
                          num_lookup_slots=5, policy=policy)
    scheduler.add(request("a", 5))
    step(scheduler)
    batch, _ = step(scheduler)
    w = batch.seqs[0]
    assert (w.num_tree_slots, w.num_draft_slots, w.drafts_with_head) == (2, 2 + 5, True)
    policy.tree_nodes = None  # the largest
    batch, _ = step(scheduler)
    assert (batch.seqs[0].num_tree_slots, batch.seqs[0].num_draft_slots) == (7, 7 + 5)


# ---- prefix caching -------------------------------------------------------------------------


def test_a_prompt_starting_with_computed_blocks_skips_them():
    s = make(caching=True)
    s.add(request("a", 10))
    step(s)  # a's prompt: blocks 0 and 1 full and computed, 2 tokens in block 2
    s.add(Request("b", list(range(10, 18)) + [99, 98, 97], GREEDY, 100))
    batch, _ = step(s)
    (work,) = [w for w in batch.seqs if w.request_id == "b"]
    b = s.requests["b"]
    assert work.start_pos == 8 and work.token_ids == [99, 98, 97]
    assert b.block_table[:2] == s.requests["a"].block_table[:2]
    assert b.num_cached_tokens == 8
    assert (s.num_queried_tokens, s.num_cached_tokens) == (10 + 11, 8)


def test_with_a_draft_head_the_last_hit_block_is_computed_again_only_to_keep_the_heads_context():
    """The hit is whole unless the head's entries of its last block are not the request's own
    while the block before's are, or the hit is that block alone: then that last block is
    computed again (its target features let the head resume the whole cached context, or start
    at position 0)."""

    def admitted_at(own_entries: set[int], prompt_len: int = 13) -> tuple[int, list[tuple[int, int]]]:
        asked: list[tuple[int, int]] = []  # (hit index, next token) the scheduler asked about

        def resumes(block: int, key: bytes, next_token: int) -> bool:
            index = a_table.index(block)
            asked.append((index, next_token))
            return index in own_entries

        s = Scheduler(SchedulerConfig(), BlockManager(64, 4, True), num_draft_slots=3, draft_resumes=resumes)
        s.add(request("a", 14))
        step(s)  # a's prompt: blocks 0-2 full and computed
        a_table = s.requests["a"].block_table
        s.add(request("b", prompt_len))  # a's first tokens: 13 are three full blocks and a last token
        batch, _ = step(s)
        (work,) = [w for w in batch.seqs if w.request_id == "b"]
        return work.start_pos, asked

    assert admitted_at(set()) == (12, [(2, 22), (1, 18)])  # nothing to resume: the whole hit
    assert admitted_at({0, 1}) == (8, [(2, 22), (1, 18)])  # block 2 computed again, the head resumes 0-1
    assert admitted_at({0, 1, 2})[0] == 12  # the head resumes past the whole hit
    assert admitted_at({2})[0] == 12
    assert admitted_at(set(), prompt_len=5) == (0, [(0, 14)])  # a lone block no head has fed: computed again
    assert admitted_at({0}, prompt_len=5)[0] == 4


def test_cached_blocks_are_shared_only_within_a_cache_salt():
    s = make(caching=True)
    salted = {name: SamplingParams(temperature=0, max_tokens=100, cache_salt=name) for name in ("x", "y")}
    s.add(Request("a", list(range(10, 20)), salted["x"], 100))
    step(s)  # two full blocks cached under salt x
    s.add(Request("b", list(range(10, 20)), salted["y"], 100))
    s.add(Request("c", list(range(10, 20)), GREEDY, 100))
    s.add(Request("d", list(range(10, 20)), salted["x"], 100))
    step(s)
    assert [s.requests[r].num_cached_tokens for r in "bcd"] == [0, 0, 8]


def test_the_last_prompt_token_is_computed_even_when_every_block_is_cached():
    s = make(caching=True)
    s.add(request("a", 8))
    step(s)
    s.add(request("b", 8))  # the same 8 tokens: two full cached blocks
    batch, _ = step(s)
    (work,) = [w for w in batch.seqs if w.request_id == "b"]
    assert work.start_pos == 4 and work.sample  # the second block is computed again (its last token gives logits)
    assert s.requests["b"].block_table[1] != s.requests["a"].block_table[1]


def test_output_blocks_are_cached_for_the_next_turn():
    s = make(caching=True)
    s.add(request("a", 6))
    for _ in range(4):
        step(s, token=5)  # prompt 6 + outputs 5, 5, 5, 5: two full blocks computed, then a third half
    a = s.requests["a"]
    history = a.prompt_token_ids + a.output_token_ids
    s.finish("a", "stop")
    s.add(Request("b", history + [1, 2, 3], GREEDY, 100))
    batch, _ = step(s)
    assert batch.seqs[0].start_pos == 8


def test_a_preempted_request_sharing_the_preemptors_blocks_resumes_in_the_same_step():
    s = make(num_blocks=4, block_size=4, caching=True)
    s.add(request("old", 6))
    s.add(request("new", 6))  # the same prompt, and the same outputs below
    for _ in range(3):
        step(s)
    batch, _ = step(s)  # old's growth preempts new, which comes back at once on old's two blocks
    new = s.requests["new"]
    assert s.num_preemptions == 1 and new.status is RequestStatus.RUNNING
    assert new.block_table[:2] == s.requests["old"].block_table[:2]
    (work,) = [w for w in batch.seqs if w.request_id == "new"]
    assert work.start_pos == 8 and work.is_decode and not work.num_draft_slots


def test_without_caching_every_prompt_is_computed():
    s = make(caching=False)
    s.add(request("a", 10))
    step(s)
    s.add(request("b", 10))
    batch, _ = step(s)
    (work,) = [w for w in batch.seqs if w.request_id == "b"]
    assert work.start_pos == 0 and s.requests["b"].num_cached_tokens == 0


def test_a_preempted_request_comes_back_through_its_own_cached_blocks():
    s = make(num_blocks=4, block_size=4, caching=True)
    s.add(request("old", 6))
    s.add(Request("new", list(range(50, 56)), GREEDY, 100))
    for _ in range(4):
        step(s)  # as in the test without caching: new is preempted in the last step
    new = s.requests["new"]
    # old took new's last block (freed cached blocks go last block first); its first is still cached
    assert new.status is RequestStatus.WAITING and s.num_preemptions == 1
    s.finish("old", "stop")
    known = new.prompt_token_ids + new.output_token_ids
    batch, _ = step(s)
    work = batch.seqs[0]
    assert work.request_id == "new" and work.start_pos == 4 and work.token_ids == known[4:]
    assert new.num_cached_tokens == 0  # a readmission's hits are not the prompt's
