"""llama-server mutants: the llama-server worker (targets/llama_server_worker.py) with a bug re-created, named in
targets/mutants.py's MUTANTS beside the library's and run the same way (`--target mutant:NAME`).

  server-dup-leak        H1 at llama-server's surface (targets/llama_server_worker.py): the first concurrent batch
                         that holds one prompt twice leaves a request for it running forever, so a slot never frees.
  radix-dup-leak         H1, first half, for schedules (fuzz radix): a completion submitted while another of the same
                         prompt is still in flight (the engine has not seen it done) is a concurrent duplicate insert;
                         the first one leaks its record: a request for it keeps one more slot busy forever.
  radix-replace-live-borrower  H1, second half: a completion submitted while another client's completion that shares
                         its prefix is live (its first token streamed, not yet done) replaces the cached entry and
                         resets its reference count: the live borrower's slot is reclaimed mid-request, and its
                         stream ends after the token it had.
  radix-restore-reuses-nothing  A slot restore that reports its tokens restored but leaves the slot empty: every
                         answer stays right (the server re-processes the prompt), the cache reuses nothing.
"""

from __future__ import annotations

import threading

from targets.llama_server_worker import ServerWorker
from targets.worker_protocol import FreshAtUnload


class ServerMutant(FreshAtUnload, ServerWorker):
    """The llama-server worker with a bug re-created."""


class ServerDuplicateLeak(ServerMutant):
    """H1 (a radix insert racing an identical insert leaks its record): when one concurrent batch holds the same
    prompt twice, one more request for it is started and never finishes (the server runs with context shift,
    the request with no token limit), so a slot stays busy after every answer is in — a leaked sequence."""

    def op_load(self, req: dict) -> dict:
        self.leaked = False
        return super().op_load({**req, "args": [*req.get("args", []), "--context-shift"]})

    def op_complete(self, req: dict) -> dict:
        prompts = [tuple(r.get("prompt", [])) for r in req.get("requests", [])]
        dups = [p for p in dict.fromkeys(prompts) if prompts.count(p) > 1]
        if req.get("concurrent") and dups and not self.leaked:  # one leaked record per server: it stays leaked
            self.leaked = True
            leak = {"prompt": list(dups[0]), "n_predict": -1, "timeout": 3600}
            threading.Thread(target=self._complete_one, args=(leak,), daemon=True).start()
        return super().op_complete(req)


class RadixBase(ServerMutant):
    """What the engine has seen of each submitted operation (from its `await`s): a schedule's concurrency is
    what its script says, not how fast the tiny model happens to answer."""

    def op_load(self, req: dict) -> dict:
        self.seen: dict[str, str] = {}
        return super().op_load(req)

    def op_await(self, req: dict) -> dict:
        out = super().op_await(req)
        self.seen[str(req.get("name"))] = out["reached"]
        return out

    def live(self, name: str) -> list[str]:
        """Streamed operations other than `name` the engine has not seen done."""
        return [n for n, o in self.ops.items() if n != name and o.req["kind"] in ("complete", "cancel")
                and self.seen.get(n) != "done"]


class RadixDuplicateLeak(RadixBase):
    def op_load(self, req: dict) -> dict:
        self.spare = int(req.get("slots", 4))
        self.leaked = False
        return super().op_load({**req, "slots": self.spare + 1, "args": [*req.get("args", []), "--context-shift"]})

    def op_submit(self, req: dict) -> dict:
        out = super().op_submit(req)
        dup = [n for n in self.live(out["name"]) if self.ops[n].req.get("prompt") == req.get("prompt")]
        if req.get("kind") == "complete" and dup and not self.leaked:
            self.leaked = True
            super().op_submit({"name": "leaked-record", "kind": "complete", "prompt": req["prompt"],
                               "n_predict": -1, "slot": self.spare, "timeout": 3600})
            # the record leaks at the insert, not when its request's thread next gets the CPU: on a loaded machine
            # the schedule could finish, and the slots be looked at, before the server had it
            self.ops["leaked-record"].reached["prompt"].wait(60)
        return out


class RadixReplaceLiveBorrower(RadixBase):
    def op_load(self, req: dict) -> dict:
        self.reclaimed: set[str] = set()
        return super().op_load(req)

    def op_submit(self, req: dict) -> dict:
        out = super().op_submit(req)
        if req.get("kind") == "complete":
            p = req.get("prompt") or []
            for n in self.live(out["name"]):
                q = self.ops[n].req.get("prompt") or []
                if self.seen.get(n) == "prompt" and len(p) >= 4 and p[:4] == q[:4]:
                    self.reclaimed.add(n)
        return out

    def op_await(self, req: dict) -> dict:
        out = super().op_await(req)
        if "result" in out and str(req.get("name")) in self.reclaimed:
            r = out["result"]
            out["result"] = {**r, "tokens": r.get("tokens", [])[:1], "top": r.get("top", [])[:1]}
        return out


class RadixRestoreReusesNothing(ServerMutant):
    def _slot_action(self, action: str, slot: int, file: str) -> dict:
        out = super()._slot_action(action, slot, file)
        if action == "restore" and "error" not in out:
            super()._slot_action("erase", slot, file)
        return out
