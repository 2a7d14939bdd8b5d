"""The prefix-cache lane's rewind conversations and the bump's reuse comparison, judged without llama-server (the
server side: tests/test_prefix_cache.py)."""

from fuzz.oracles import conversations as pc


def test_the_rewind_conversations_are_seeded_and_go_back():
    """32 conversations: per prompt length (6, 8, 12, 24, 40) the prompt cut back to 2, 3, 4, half and two before
    its end (fewer where those coincide), one with a second turn cut back inside, and one whose third turn carries
    the second's answer before the second turn is continued otherwise; the same seed, the same ones."""
    convs = pc.rewind_conversations(64, 0)
    assert convs == pc.rewind_conversations(64, 0) and convs != pc.rewind_conversations(64, 1)
    assert len(convs) == 32 and [len(c) for c in convs].count(3) == 5 and [len(c) for c in convs].count(4) == 5
    assert [pc.shared_prefix(c[0], c[1]) >= k for c, k in zip(convs[:4], (2, 3, 4, 4), strict=True)] == [True] * 4
    assert [len(c[0]) for c in convs if len(c) == 3] == [6, 8, 12, 24, 40]
    second = [c for c in convs if len(c) == 3][-1]
    assert second[1][:40] == second[0] and second[2][:43] == second[1][:43]
    p, turn, third, again = [c for c in convs if len(c) == 4][-1]
    assert turn[:40] == p and third[:46] == turn and third[46] == pc.ANSWER and len(third) == 52
    assert again[:46] == turn and len(again) == 50 and pc.ANSWER not in again
    assert pc.shared_prefix([1, 2, 3], [1, 2, 4]) == 2 and pc.shared_prefix([], [1]) == 0


def test_a_bump_whose_candidate_reuses_less_broke_and_one_that_reuses_more_did_not():
    """The bump compares the prefix-cache lane's rewind reuse across builds (fuzz.certify.bump.reuse_regression): fewer
    prompt tokens from the cache on any request is a regression, named; the same or more is not."""
    from fuzz.certify import bump as bp
    def lane(cache_n):
        rewinds = [{"lengths": [6, 5], "shared": [0, 2], "cache_n": c} for c in cache_n]
        return {"row": "laguna", "lane": "prefix-cache", "status": "pass", "detail": "ok",
                "reports": [{"oracle": "prefix-cache", "rewinds": rewinds}, {"oracle": "radix"}]}

    base = lane([[0, 1], [0, 3]])
    assert bp.reuse_regression(base, lane([[0, 1], [0, 3]])) is None
    assert bp.reuse_regression(base, lane([[0, 2], [0, 3]])) is None
    assert bp.reuse_regression(base, lane([[0, 1], [0, 0]])) == (
        "prompt-cache reuse regression: 1 requests take fewer prompt tokens from the cache; first: rewind "
        "conversation 1, request 1 (5 tokens, 2 shared with the one before): the base took 3, the candidate 0")
    run = {"results": [base]}
    (v,) = bp.verdicts(run, {"results": [lane([[0, 0], [0, 3]])]}, {})
    assert v["verdict"] == "broke" and v["detail"].startswith("prompt-cache reuse regression") and \
        v["detail"].endswith("| ok")
    (v,) = bp.verdicts(run, {"results": [lane([[0, 1], [0, 3]])]}, {})
    assert v["verdict"] == "unchanged"


def test_the_clients_take_turns_so_a_turn_finds_its_conversation_in_its_slot_the_other_or_the_host_cache():
    """Three clients of four turns (each later turn: the one before, its answer, 4 new tokens) and two one-turn
    clients sharing 8 tokens of A's first turn and 20 of B's; sent in CLIENT_ORDER, 16 requests; seeded."""
    convs, order = pc.client_conversations(64, 0)
    assert convs == pc.client_conversations(64, 0)[0] and convs != pc.client_conversations(64, 1)[0]
    assert [len(c) for c in convs] == [4, 4, 4, 1, 1] and len(order) == 16
    assert all(c[j] == [pc.PREVIOUS, pc.ANSWER, *c[j][2:]] and len(c[j]) == 6 for c in convs[:3] for j in (1, 2, 3))
    (a, *_), (b, *_) = convs[:2]
    assert pc.shared_prefix(convs[3][0], a) >= 8 and len(convs[3][0]) == 14
    assert pc.shared_prefix(convs[4][0], b) >= 20 and len(convs[4][0]) == 23
    # every turn after the first is sent after the turn before it (its placeholders filled from that one)
    assert all(order.index((i, j - 1)) < order.index((i, j)) for i, j in order if j)


def test_the_conversations_fill_a_turn_from_the_last_time_the_turn_before_was_sent():
    """converse(): ANSWER → the turn before's answer, PREVIOUS → its prompt; a turn sent again is named +2."""
    from targets.client import Reply

    class Echo:  # (a stand-in llama-server answering each prompt with its last token, 5 tokens cached)
        def __init__(self):
            self.prompts = []

        def call(self, op, requests=(), **kw):
            self.prompts.append(requests[0]["prompt"])
            return Reply(True, {"results": [{"tokens": requests[0]["prompt"][-1:], "cache_n": 5, "id_slot": 0}]})

    t = Echo()
    sent, answers, failed = pc.converse(t, [[[1, 2], [pc.PREVIOUS, pc.ANSWER, 3]]], [(0, 0), (0, 1), (0, 0)], 1, "x")
    assert failed is None and list(sent) == ["x0.0", "x0.1", "x0.0+2"]
    assert t.prompts == [[1, 2], [1, 2, 2, 3], [1, 2]]
    assert pc.reuse(sent, answers, list(sent)) == {"lengths": [2, 4, 2], "shared": [0, 2, 2], "cache_n": [5, 5, 5],
                                                   "slots": [0, 0, 0]}


def test_a_bump_compares_the_clients_reuse_too_naming_the_request():
    from fuzz.certify import bump as bp

    def lane(cache_n):
        clients = {"name": "clients taking turns on two slots", "order": ["client0.0", "client1.0", "client1.1"],
                   "lengths": [24, 24, 31], "shared": [0, 0, 0], "cache_n": cache_n}
        return {"row": "qwen3", "lane": "prefix-cache", "status": "pass", "detail": "ok",
                "reports": [{"oracle": "prefix-cache", "rewinds": [], "clients": clients}]}

    assert bp.reuse_regression(lane([0, 0, 26]), lane([0, 0, 26])) is None
    assert bp.reuse_regression(lane([0, 0, 26]), lane([0, 0, 0])) == (
        "prompt-cache reuse regression: 1 requests take fewer prompt tokens from the cache; first: clients taking "
        "turns on two slots, request 2 (client1.1) (31 tokens, 0 shared with the one before): the base took 26, the "
        "candidate 0")


def test_a_candidate_whose_state_carries_more_cells_breaks_the_row():
    """The cross-build lane's capacity rule (upstream 23720's class): the same sequence's export carrying more KV
    cells on the candidate than on the base breaks the row; as many, fewer, or a memory whose state is not cells
    (recurrent, hybrid: None) does not."""
    from fuzz.certify import bump as bp

    def states(base, candidate):
        return {"base → candidate": {"cells": base}, "candidate → base": {"cells": candidate}}

    assert bp.state_growth(states(20, 32)) == ("the candidate's export of the same sequence carries 32 KV cells "
                                               "where the base's carries 20: the state a stage sends grows, and an "
                                               "importer needs room for 12 more cells")
    assert [bp.state_growth(states(a, b)) for a, b in ((20, 20), (32, 20), (None, 32), (20, None))] == [None] * 4
