"""Which state llama-server restored: its checkpoint log read (the worker) and judged against the prompts (pure)."""

from fuzz.oracles.server_checkpoints import judge_restores, stale_message
from targets.llama_server_worker import checkpoint_event

# what the pinned server printed at -lv 4 (laguna, one slot, three prompts), verbatim but for the timestamps
LOG = """\
0.03.026.457 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 256, n_keep = 0, task.n_tokens = 8
0.03.061.066 I slot create_check: id  0 | task 0 | created context checkpoint 1 of 32 (pos_min = 0, pos_max = 3, \
n_tokens = 4, size = 0.002 MiB)
0.03.102.034 I slot   operator(): id  0 | task 5 | checking checkpoint with [0, 3] against 0...
0.03.102.036 I slot   operator(): id  0 | task 5 | restored context checkpoint (pos_min = 0, pos_max = 3, \
n_tokens = 4, n_past = 3, size = 0.002 MiB)
0.00.063.634 I srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192
"""

P0 = [1, 2, 3, 4, 5, 6, 7, 8]
P1 = [1, 9, 9, 9, 9, 9]


def prompt(slot, task, n):
    return {"event": "prompt", "slot": slot, "task": task, "n_tokens": n}


def created(slot, task, n, pos_min=0):
    return {"event": "created", "slot": slot, "task": task, "pos_min": pos_min, "pos_max": n - 1, "n_tokens": n}


def restored(slot, task, n, n_past, pos_min=0):
    return {"event": "restored", "slot": slot, "task": task, "pos_min": pos_min, "pos_max": n - 1, "n_tokens": n,
            "n_past": n_past}


def test_the_servers_log_lines_are_read_as_events_and_the_rest_is_left():
    events = [checkpoint_event(ln) for ln in LOG.splitlines()]
    assert events == [prompt(0, 0, 8), created(0, 0, 4), None, restored(0, 5, 4, 3), None]


def test_a_restore_of_the_prompts_own_prefix_passes_and_another_prompts_state_is_stale():
    sent = {0: [("A0", P0), ("A1", P0[:5] + [9, 9])]}
    ok = judge_restores([prompt(0, 0, 8), created(0, 0, 4), prompt(0, 4, 7), restored(0, 4, 4, 3)], sent,
                        shared=False)
    assert (ok.restores, ok.stale, ok.unjudged) == (1, [], None)
    # 20532's shape: the slot's second prompt shares only the first token, the checkpoint of the first is kept
    # and restored for the third, which shares its first 4 tokens with the second
    sent = {0: [("A0", P0), ("A1", P1), ("A2", P1[:4] + [7, 7])]}
    v = judge_restores([prompt(0, 0, 8), created(0, 0, 4), prompt(0, 3, 6), prompt(0, 6, 6),
                        restored(0, 6, 4, 3)], sent, shared=False)
    assert v.restores == 1 and v.unjudged is None
    assert v.stale == [{"slot": 0, "task": 6, "prompt": "A2", "source": "A0", "n_past": 3, "pos_min": 0,
                        "pos_max": 3, "n_tokens": 4, "differs": 1}]
    assert "made from A0 and reused 3 of its tokens for A2, whose tokens differ from index 1" in \
        stale_message(v.stale[0])


def test_only_the_tokens_reused_are_compared():
    sent = {0: [("A0", P0), ("A1", P0[:3] + [9, 9, 9])]}  # the checkpoint stands for 4 tokens, 3 are reused
    v = judge_restores([prompt(0, 0, 8), created(0, 0, 4), prompt(0, 1, 6), restored(0, 1, 4, 3)], sent,
                       shared=False)
    assert (v.restores, v.stale) == (1, [])


def test_with_the_host_cache_a_checkpoint_made_on_another_slot_explains_a_restore():
    sent = {0: [("A0", P0)], 1: [("B0", P0[:6])]}
    events = [prompt(0, 0, 8), created(0, 0, 4), prompt(1, 2, 6), restored(1, 2, 4, 3)]
    assert judge_restores(events, sent, shared=True).stale == []
    v = judge_restores(events, sent, shared=False)  # without it, slot 1 never made one: not judged, not passed
    assert v.restores == 0 and v.stale == [] and "restored a checkpoint" in v.unjudged and "never said" in v.unjudged


def test_a_log_that_does_not_follow_the_requests_is_unjudged_not_passed():
    sent = {0: [("A0", P0)]}
    v = judge_restores([prompt(0, 0, 6)], sent, shared=False)  # a 6-token prompt where an 8-token one was sent
    assert v.unjudged and "slot 0's log does not follow its requests" in v.unjudged
    v = judge_restores([prompt(0, 0, 8), prompt(0, 1, 8)], sent, shared=False)  # more prompts than sent
    assert v.unjudged and "as its prompt 2 of 1" in v.unjudged
    v = judge_restores([prompt(0, 0, 8), created(0, 7, 4)], sent, shared=False)
    assert v.unjudged == "a checkpoint created by task 7, which began no prompt"


def test_a_checkpoint_made_past_the_prompt_cannot_be_called_stale():
    sent = {0: [("A0", [1, 2, 3]), ("A1", [5, 6, 7, 8, 9])]}  # (made while generating: its tokens are not known)
    v = judge_restores([prompt(0, 0, 3), created(0, 0, 4), prompt(0, 1, 5), restored(0, 1, 4, 3)], sent,
                       shared=False)
    assert (v.restores, v.stale, v.unjudged) == (1, [], None)
