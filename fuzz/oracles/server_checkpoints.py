"""What llama-server's own records say against what a schedule sent (no server here): which state it restored
(its checkpoint log against the prompts each slot was sent) and its /metrics counters.

A context checkpoint is the state of the memory that cannot be rolled back (sliding-window cells, recurrent
state), saved by a slot after the first n_tokens of a prompt. When a later prompt shares a prefix with what the slot
holds but that state is gone, the server restores a checkpoint and reuses n_past tokens of it. That is right only if
the checkpoint was made from the same first n_past tokens: a server that keeps a checkpoint past a divergence
(upstream 20532) restores another prompt's state, and the answer moves by whatever the model makes of it — on a
tiny fixture often too little to tell from rounding, which is why this reads the log instead of the logits.

The log (llama-server at trace level, `targets.llama_server_worker.checkpoint_event`) names slot and task per line;
the prompts a slot began are matched to its tasks in order (a slot runs one task at a time, and the engine sends a
client's operations one after another to its own slot). With the host prompt cache on, checkpoints travel with
cached prompts between slots: a restore is then explained by a checkpoint of the same shape made on any slot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fuzz.oracles.radix_schedules import STREAMED


@dataclass
class Verdict:
    restores: int = 0  # restores judged
    stale: list[dict[str, Any]] = field(default_factory=list)  # restores no checkpoint of their prompt explains
    unjudged: str | None = None  # why the log could not be read against the prompts (then nothing is judged)


def judge_restores(events: list[dict[str, Any]], prompts: dict[int, list[tuple[str, list[int]]]], *,
                   shared: bool) -> Verdict:
    """events: the server's checkpoint events in log order; prompts: per slot, (label, tokens) of each prompt it was
    sent, in order; shared: checkpoints may move between slots (the host prompt cache is on)."""
    tasks: dict[int, tuple[int, str, list[int]]] = {}  # task → (slot, label, prompt)
    begun: dict[int, int] = {}  # slot → prompts matched so far
    for e in events:
        if e["event"] != "prompt":
            continue
        s, i = e["slot"], begun.get(e["slot"], 0)
        sent = prompts.get(s, [])
        if i >= len(sent) or len(sent[i][1]) != e["n_tokens"] or e["task"] in tasks:
            return Verdict(unjudged=f"slot {s}'s log does not follow its requests (task {e['task']}, a "
                                    f"{e['n_tokens']}-token prompt, as its prompt {i + 1} of {len(sent)})")
        tasks[e["task"]] = (s, *sent[i])
        begun[s] = i + 1
    verdict = Verdict()
    made: list[tuple[int, tuple[int, int, int], str, list[int] | None]] = []  # (slot, shape, label, its tokens)
    for e in events:
        if e["event"] == "prompt":
            continue
        if e["task"] not in tasks:
            return Verdict(unjudged=f"a checkpoint {e['event']} by task {e['task']}, which began no prompt")
        slot, label, prompt = tasks[e["task"]]
        shape = (e["pos_min"], e["pos_max"], e["n_tokens"])
        if e["event"] == "created":  # (made while the prompt is processed: its first n_tokens; else not known)
            made.append((slot, shape, label, prompt[:e["n_tokens"]] if e["n_tokens"] <= len(prompt) else None))
            continue
        verdict.restores += 1
        n = e["n_past"]
        mine = [m for m in made if m[1] == shape and (shared or m[0] == slot)]
        if not mine:
            return Verdict(unjudged=f"slot {slot} restored a checkpoint (pos {shape[0]}..{shape[1]}, {shape[2]} "
                                    "tokens) the log never said it made")
        if any(toks is None or toks[:n] == prompt[:n] for _, _, _, toks in mine):
            continue
        _, _, source, toks = mine[-1]
        differs = next((i for i, (a, b) in enumerate(zip(toks, prompt, strict=False)) if a != b), n)
        verdict.stale.append({"slot": slot, "task": e["task"], "prompt": label, "source": source, "n_past": n,
                              "pos_min": shape[0], "pos_max": shape[1], "n_tokens": shape[2], "differs": differs})
    return verdict


def stale_message(s: dict[str, Any]) -> str:
    return (f"slot {s['slot']} restored a context checkpoint (positions {s['pos_min']}..{s['pos_max']}, "
            f"{s['n_tokens']} tokens) made from {s['source']} and reused {s['n_past']} of its tokens for "
            f"{s['prompt']}, whose tokens differ from index {s['differs']}: another prompt's state")


def metrics_problem(m: dict[str, float], ops: dict[str, dict[str, Any]], ref: dict[str, Any]) -> str | None:
    """The server's counters against what the schedule sent: prompt tokens processed + reused = every streamed
    prompt's length; tokens predicted at least what was received and at most what was asked; nothing processing
    or deferred."""
    streamed = [o for o in ops.values() if o["op"].kind in STREAMED]
    sent = sum(len(ref["prompts"][o["prompt"]]) for o in streamed)
    counted = m.get("llamacpp:prompt_tokens_total", 0) + m.get("llamacpp:prompt_tokens_cached_total", 0)
    got = sum(len(o["result"].get("tokens", [])) for o in streamed)
    predicted = m.get("llamacpp:tokens_predicted_total", 0)
    asked = sum(len(ref["answers"][o["prompt"]]["tokens"]) if o["op"].kind != "cancel" else 10 ** 6
                for o in streamed)
    if counted != sent:
        return f"/metrics counts {counted:g} prompt tokens processed or reused; the schedule sent {sent}"
    if not got <= predicted <= asked:
        return f"/metrics counts {predicted:g} tokens predicted; the clients received {got}"
    if m.get("llamacpp:requests_processing", 0) or m.get("llamacpp:requests_deferred", 0):
        return "/metrics: requests still processing or deferred after the schedule"
    return None
