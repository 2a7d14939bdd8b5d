"""The n-gram speculators' drafts re-derived from the slot's tokens (fuzz/oracles/ngram_drafts.py): what
server-options holds llama-server's drafts to. Pure; the runs are server-options' own tests."""

from fuzz.oracles.ngram_drafts import (
    NgramMod,
    first_ngram_draft,
    mod_judged,
    mod_sizes,
    ngram_draft,
    ngram_problems,
    predict,
)


def test_ngram_simple_must_draft_where_its_pattern_is_in_the_slots_tokens():
    """llama.cpp's ngram-simple looks up the slot's last n-1 tokens and the token just sampled, backwards in the slot's
    tokens (never at position 0), and drafts the m tokens after the match — if at least n follow it. Until its first
    draft a slot asks after every token, so where an answer reaches such a token the server must have drafted
    (server-options' promise; which drafts are accepted is the model's)."""
    assert ngram_draft([5, 1, 2, 3, 9, 8, 1], 2, 2, 3) == (1, 3)  # [1, 2] at 1, three tokens after it
    assert ngram_draft([1, 2, 7, 7, 7, 7, 1], 2, 2, 3) is None  # only at position 0
    assert ngram_draft([5, 1, 2, 3, 9, 1, 2], 3, 3, 2) is None  # m < n: fewer than n tokens to copy
    assert ngram_draft([5, 1, 2, 3, 1, 1], 2, 2, 3) is None  # too short to draft at all (n + m + 1 tokens)
    assert ngram_draft([4, 6, 6, 2, 9, 8, 3], 6, 1, 2) == (2, 2)  # n 1: the sampled token alone, latest match first
    # the first token of the answer finds nothing; the second, with the first in the slot's tokens, does
    prompt = [5, 1, 2, 3, 9, 8, 4]
    assert first_ngram_draft(prompt, [1, 2, 0, 0], 2, 3) == (1, 1, 3)
    assert first_ngram_draft(prompt, [1, 2, 0], 2, 3) is None  # (no room left for a draft after the second)
    a = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "3"]

    def problems(a, **answer):
        return ngram_problems(a, {"sent": {"random+": prompt}, "got": {"random+": {"tokens": [1, 2, 0, 0], **answer}}})

    assert problems(a, draft_n=3) == []
    assert problems(a, draft_n=0) == ["random+: ngram-simple (size-n 2, size-m 3) drafted nothing, though at "
                                      "generated token 1 its pattern stands at position 1 of the slot's tokens with "
                                      "3 after it"]
    for other in ("ngram-mod", "ngram-simple,draft-simple"):  # another speculator may draft otherwise
        assert problems(["--spec-type", other, *a[2:]], draft_n=0) == []


MOD = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-min", "1",
       "--spec-ngram-mod-n-max", "3"]


def test_ngram_mod_drafts_the_chain_of_what_followed_the_last_tokens_where_last_written():
    """n-match 2: the prompt's pairs are written as its generation begins, a later writer of a pair winning; a
    draft follows the chain from the slot's last token and the one just sampled until a pair is missing (none at
    all below n-min), cut to what the answer has room for (one token less than remain); the target accepts the
    prefix that matches its own picks and adds its next one."""
    prompt = [1, 2, 3, 1, 2, 3, 9]  # (1,2)→3, (2,3)→1 then →9, (3,1)→2
    mod = NgramMod(2, 1, 3)
    mod.begin(0, prompt)
    assert mod.draft(0, prompt, 1) == []  # (9,1): nothing, and n-min is 1
    assert mod.draft(0, [*prompt, 1], 2) == [3, 9]  # (1,2)→3, (2,3)→9, (3,9) missing
    assert mod.slots[0].n_draft_last == 2
    one = {"slot": 0, "prompt": prompt, "n_predict": 6}
    assert predict((2, 1, 3), [{**one, "tokens": [1, 2, 3, 9, 5, 5]}], 1024, False) == ([(2, 2)], 0)
    assert predict((2, 1, 3), [{**one, "tokens": [1, 2, 3, 7, 5, 5]}], 1024, False) == ([(2, 1)], 0)
    assert predict((2, 1, 3), [{**one, "tokens": [1, 2, 3, 9], "n_predict": 4}], 1024, False) == ([(1, 1)], 0)
    assert predict((2, 3, 3), [{**one, "tokens": [1, 2, 3, 9, 5, 5]}], 1024, False) == ([(0, 0)], 0)  # n-min 3


def test_ngram_mod_adds_a_slots_own_tokens_in_chunks_and_five_poor_drafts_empty_the_table():
    mod = NgramMod(1, 1, 2)
    mod.begin(0, [4, 5, 6])  # (4)→5, (5)→6; added up to position 2
    tokens = [4, 5, 6] + [7] * 31 + [8]
    assert mod.draft(0, tokens[:-1], 8) == []  # 34 tokens: 2 + 32 is not beyond them, (8) unknown
    assert mod.draft(0, tokens, 4) == [5, 6]  # (the chain stops at n-max)
    assert mod.table[mod.idx([7], 0)] == 8 and mod.slots[0].i_last == 34  # (the chunk: every pair up to the end)
    for k in range(5):  # under a quarter of each draft accepted, five times in a row
        assert mod.draft(0, tokens, 4) == [5, 6]
        mod.accept(0, 0 if k != 2 else 1)  # (1 of 2 is not poor: the run starts again)
    assert mod.resets == 0
    for _ in range(3):
        mod.draft(0, tokens, 4)
        mod.accept(0, 0)
    assert mod.resets == 1 and mod.table == {} and mod.draft(0, tokens[:3], 4) == []
    assert mod.draft(0, tokens, 4) == [5, 6]  # (the slot's own tokens added again from the start)


def test_a_memory_that_cannot_drop_a_suffix_decodes_a_partly_accepted_draft_again():
    """On a partial acceptance a recurrent or hybrid slot restores its checkpoint and decodes the accepted tokens
    and the target's pick again as a draft: the speculator is told one more accepted (the pick), the counts are
    the first pass's, and the answer moves on by one more token before the next draft."""
    prompt = [1, 2, 3, 7, 8, 1, 2, 3, 9]  # (3,7)→8, (7,8)→1; (2,3)→9 last
    one = {"slot": 0, "prompt": prompt, "tokens": [1, 2, 3, 7, 8, 1, 5, 5, 5], "n_predict": 9}
    # the draft after 1, 2 is [3, 9]: 3 accepted, 7 picked; then (3,7) drafts [8, 1], both accepted
    assert predict((2, 1, 2), [one], 1024, False) == ([(4, 3)], 0)
    # decoded again, 3 and 7 yield 8 too: the next draft from (7,8) is [1, 2], 1 accepted
    assert predict((2, 1, 2), [one], 1024, True) == ([(4, 2)], 0)


def test_the_ngram_mod_control_must_draft_and_accept_what_the_table_says_in_each_request():
    assert mod_sizes(MOD) == (2, 1, 3)
    assert mod_sizes(["--spec-type", "draft-simple,ngram-mod", *MOD[2:]]) is None  # another speculator first
    assert mod_sizes(MOD[:-2]) is None
    asked = [{"prompt": [1, 2, 3, 1, 2, 3, 9], "tokens": [1, 2, 3, 9, 5, 5], "n_predict": 6, "id_slot": 0,
              "draft_n": 2, "draft_n_accepted": 2}]
    control = {"asked": asked, "n_ctx": 1024, "replay": False}
    assert mod_judged(MOD, control) == ([], {"ngram_mod": {"drafted": [2], "accepted": [2], "resets": 0}})
    problems, _ = mod_judged(MOD, {**control, "asked": [{**asked[0], "draft_n_accepted": 1}]})
    assert problems == ["ngram-mod (n-match 2, n-min 1, n-max 3): request 1 of 1 sent one at a time drafted 2 "
                        "tokens, 1 accepted; its table, re-derived from the slots' tokens, drafts 2, 2 accepted"]
    assert mod_judged(MOD, {**control, "asked": [{**asked[0], "error": "x"}]}) == ([], {})
    assert mod_judged(MOD, None) == ([], {})
