"""Backend samplers a llama.cpp worker sets on a context's sequences (llama_set_sampler: sampling in the graph): the
chain llama-server builds for a greedy request that ignores end of generation — a logit bias of -inf on every
end-of-generation token, top-k 1, top-p 0.95, min-p 0.05, temperature 0, dist (common/sampling.cpp's order; the
samplers that do nothing at llama-server's defaults are left out, as llama.cpp leaves them out of the graph)."""

from __future__ import annotations

from typing import Any

from targets.worker_protocol import RequestError


def eog_tokens(L: Any, model: Any) -> list[int]:
    """The model's end-of-generation tokens (llama_vocab_is_eog)."""
    vocab = L.llama_model_get_vocab(model)
    return [t for t in range(L.llama_vocab_n_tokens(vocab)) if L.llama_vocab_is_eog(vocab, t)]


def greedy_chain(L: Any, model: Any, eog: list[int]) -> Any:
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    if eog:
        bias = (L.llama_logit_bias * len(eog))(*[L.llama_logit_bias(t, float("-inf")) for t in eog])
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(n_vocab, len(eog), bias))
    for s in (L.llama_sampler_init_top_k(1), L.llama_sampler_init_top_p(0.95, 1), L.llama_sampler_init_min_p(0.05, 1),
              L.llama_sampler_init_temp_ext(0.0, 0.0, 1.0), L.llama_sampler_init_dist(0)):
        L.llama_sampler_chain_add(chain, s)
    return chain


def set_greedy(L: Any, ctx: Any, model: Any, seqs: list[int]) -> tuple[dict[int, Any], list[int]]:
    """The greedy chain as each sequence's backend sampler: the chains by sequence (freed by free_chains after the
    context), and the end-of-generation tokens they bias away (nothing asked, nothing looked up: a vocabulary's
    tokens are asked one call each)."""
    if not seqs:
        return {}, []
    eog = eog_tokens(L, model)
    chains: dict[int, Any] = {}
    for s in seqs:
        chains[s] = greedy_chain(L, model, eog)
        if not L.llama_set_sampler(ctx, s, chains[s]):
            free_chains(L, chains)
            raise RequestError("load_failed", f"load: llama_set_sampler refused the greedy chain on sequence {s}")
    return chains, eog


def free_chains(L: Any, chains: dict[int, Any]) -> None:
    for chain in chains.values():
        L.llama_sampler_free(chain)
    chains.clear()
