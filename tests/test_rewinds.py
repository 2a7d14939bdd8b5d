"""The prefix-cache lane's rewind conversations and the bump's reuse comparison, judged without llama-server (the
server side: tests/test_prefix_cache.py)."""

from fuzz.oracles import prefix_cache as pc


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
