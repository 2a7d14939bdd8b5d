"""llama-server's wrong answers as a maintainer reproduces them: repro.sh, a shell script that starts llama-server on
the model with the flags the finding's server ran with, sends it the requests the toolkit sent (curl, one after
another; the requests of a concurrent round side by side), and compares the answer the finding names with the same
prompt's answer from a second llama-server that caches nothing. Exit 1 while they differ (the defect), 0 once they
agree, 2 when it cannot run. What the script sends is the server worker's requests as logged in a run of the bundle
(targets.worker_protocol.CALL_LOG), so nothing of this toolkit is needed to run it."""

from __future__ import annotations

import json
from typing import Any

from synth.errors import UserError

# the server worker's requests that change nothing (a checkpoint log read back included): not sent
QUERIES = frozenset({"hello", "slots", "info", "checkpoints"})


def server_flags(req: dict[str, Any]) -> list[str]:
    """The llama-server flags a worker's `load` request starts it with (targets.llama_server_worker: its DEFAULTS and
    the flags every start adds)."""
    from targets.llama_server_worker import DEFAULTS

    p = {**DEFAULTS, **{k: req[k] for k in DEFAULTS if k in req}}
    return [str(f) for f in ("-np", p["slots"], "-c", p["n_ctx"], "--cache-ram", p["cache_ram"], "-b", p["n_batch"],
                             "-ub", p["n_ubatch"], "-t", p["threads"], "-tb", p["threads"], "--no-webui",
                             "--no-warmup", "-fit", "off", *req.get("args", []))]


def answer_run(logs: list[list[dict[str, Any]]], finding: Any, commit: str | None) -> dict[str, Any]:
    """The requests of the server worker that gave the finding's answer: from its last start before it to the
    request of the finding's prompt, each submitted operation awaited before the next is sent (operations that
    overlap have no script line yet: refused), and the prompt the reference answers alone."""
    prompt, answer = named(finding.detail or {})
    if answer is None:
        raise UserError("the finding names no answer (a crash, a leaked slot, a capacity problem): no standalone "
                        "reproducer for it yet — replay it with `fuzz replay`")
    for log in logs:
        reqs = [e["request"] for e in log if "request" in e]
        outcomes = [e for e in log if "request" not in e]  # (each request's, after it: the answers' tokens)
        at = next((i for i, r in enumerate(reqs) for q in asked(r) if (prompt is None or q == prompt)
                   and answered(reqs, outcomes, i, q) == answer), None)
        if at is None:
            continue
        prompt = prompt or next(q for q in asked(reqs[at]) if answered(reqs, outcomes, at, q) == answer)
        start = max((i for i in range(at) if reqs[i]["op"] == "load"), default=None)
        if start is None or (reqs[start].get("slots") == 1 and reqs[start].get("cache_ram") == 0):
            continue  # (the reference: one slot, nothing cached)
        steps = [r for r in reqs[start + 1:at + 1] if r["op"] not in QUERIES]
        return {"flags": server_flags(reqs[start]), "steps": ordered(steps), "prompt": prompt,
                "answer": answer, "commit": commit, "problem": {"check": "answer", "message": finding.message}}
    raise UserError("no request answered as the finding says in the run of the bundle (a stream the client "
                    "cancelled has no script line yet): replay it with `fuzz replay`")


def deaths(logs: list[list[dict[str, Any]]]) -> list[tuple[list[dict[str, Any]], dict[str, Any], str]]:
    """Each logged request a server worker's llama-server died of a signal in: (its worker's log, the request's
    entry, the error), in log order."""
    return [(log, a, str(b.get("error", ""))) for log in logs for a, b in zip(log, log[1:], strict=False)
            if "request" in a and "signal" in str(b.get("error", ""))]


def died_run(logs: list[list[dict[str, Any]]], commit: str | None) -> dict[str, Any] | None:
    """The requests of a server worker whose llama-server died of a signal during them: from its last start to the
    request it died in (None: none died so)."""
    for log, a, error in deaths(logs):
        if a["request"].get("op") != "load":
            reqs = [e for e in log if "request" in e]
            upto = [e["request"] for e in reqs[:reqs.index(a) + 1]]
            start = max(j for j, r in enumerate(upto) if r["op"] == "load")
            model = upto[start].get("path")  # (a draft model that is the model itself: the file beside the script)
            flags = ['"$dir/model.gguf"' if f == model else f for f in server_flags(upto[start])]
            if any(f.endswith(".gguf") and f != '"$dir/model.gguf"' for f in flags):
                raise UserError("llama-server ran with a second model (a draft of other weights): no standalone "
                                "reproducer for it yet — replay the bundle with `fuzz replay`")
            return {"flags": flags, "commit": commit, "died": True,
                    "steps": ordered([r for r in upto[start + 1:] if r["op"] not in QUERIES]),
                    "problem": {"check": "crash", "message": error}}
    return None


def died_script(run: dict[str, Any], title: str) -> str:
    """repro.sh of a llama-server that dies during requests: started with the finding's flags, sent its requests
    (side by side where they were), then asked whether it still runs: gone by a signal is the defect (exit 1), still
    answering is fixed (exit 0)."""
    sent = own_waits([x.replace(" >/dev/null", " >/dev/null 2>&1") for r in run["steps"] for x in lines_of(r)])
    return "\n".join([
        "#!/bin/sh", f"# {title}.", "#",
        f"# llama.cpp {run['commit']}: llama-server (LLAMA_SERVER, else the one on PATH) on the model beside this",
        "# file, sent the requests below. Exits 1 while the defect is present (llama-server dies of a signal), 0 once",
        "# it is fixed (it answers them and still runs), 2 when it cannot run (no llama-server, no curl).",
        'server=${LLAMA_SERVER:-llama-server}', 'port=${PORT:-18182}', 'dir=$(cd "$(dirname "$0")" && pwd)',
        'command -v "$server" >/dev/null 2>&1 || { echo "cannot run: no $server (set LLAMA_SERVER)"; exit 2; }',
        'command -v curl >/dev/null 2>&1 || { echo "cannot run: no curl"; exit 2; }',
        'log=$(mktemp); slots=$(mktemp -d)  # what llama-server printed; where it saves slots',
        f'GGML_NO_BACKTRACE=1 "$server" -m "$dir/model.gguf" --host 127.0.0.1 --port "$port" --slot-save-path "$slots" '
        f'{" ".join(run["flags"])} >"$log" 2>&1 &',
        "pid=$!; i=0",
        'until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do',
        '  kill -0 $pid 2>/dev/null || { echo "cannot run: llama-server exited as it started; see $log"; exit 2; }',
        "  i=$((i + 1)); [ $i -lt 600 ] || { kill $pid; echo \"cannot run: llama-server did not start\"; exit 2; }",
        "  sleep 0.1", "done",
        "post() {  # POST $2 to $1 (a server that dies answers nothing)",
        "  curl -s -X POST \"http://127.0.0.1:$port$1\" -H 'Content-Type: application/json' -d \"$2\"", "}", "",
        *sent, "sleep 0.5", "",
        "if ! kill -0 $pid 2>/dev/null; then",
        "  wait $pid; rc=$?",
        '  if [ $rc -gt 128 ]; then echo "DEFECT: llama-server was killed by signal $((rc - 128)) during the requests";'
        " exit 1; fi",
        '  echo "cannot run: llama-server exited ($rc) during the requests; see $log"; exit 2',
        "fi",
        'kill $pid; wait $pid 2>/dev/null; echo "fixed: llama-server answered the requests and still runs"; exit 0',
        ""])


def own_waits(lines: list[str]) -> list[str]:
    """Script lines whose requests side by side are waited for by their own process ids: a bare `wait` would wait
    for llama-server, started in the background too."""
    return ['wait $posts; posts=""' if x == "wait" else x + ' posts="$posts $!"' if x.endswith(" &") else x
            for x in lines]


def named(d: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """The prompt (if the finding names it) and the wrong answer a finding's detail names: a prefix-cache finding's
    own, a radix finding's first (its replay names prompts by their place in a drawn tree)."""
    if d.get("answer") is not None:
        return d.get("tokens"), d["answer"]
    first = next((f for f in d.get("findings") or [] if f.get("kind") == "diverged" and f.get("tokens")), None)
    return None, first["tokens"] if first else None


def asked(r: dict[str, Any]) -> list[list[int]]:
    """The prompts a worker request sends for an answer."""
    if r["op"] == "complete":
        return [q.get("prompt") for q in r.get("requests", [])]
    return [r.get("prompt")] if r["op"] == "submit" and r.get("kind") == "complete" else []


def answered(reqs: list[dict[str, Any]], outcomes: list[dict[str, Any]], i: int, prompt: list[int]) -> Any:
    """The tokens request i answered `prompt` with, as its outcome logged them (a submitted one: its await's)."""
    r = reqs[i]
    if r["op"] == "complete":
        got = outcomes[i].get("tokens") if i < len(outcomes) else None
        j = [q.get("prompt") for q in r["requests"]].index(prompt)
        return got[j] if got and j < len(got) else None
    k = next((k for k in range(i + 1, len(reqs)) if reqs[k]["op"] == "await" and reqs[k].get("name") == r["name"]),
             None)
    got = outcomes[k].get("tokens") if k is not None and k < len(outcomes) else None
    return got[0] if got else None


def ordered(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests as the script sends them: `complete` (side by side if concurrent) and each submitted operation
    whole (its await dropped: the script waits for every request). Refused: an operation awaited at another point
    than its end, or another sent before it ends (what their overlap does has no script line yet)."""
    out, open_ = [], None
    for r in steps:
        if r["op"] == "submit":
            if open_ is not None or r.get("kind") not in ("complete", "save", "restore", "erase"):
                raise UserError(f"submitted operations overlap or are {r.get('kind')!r} (a cancelled stream): no "
                                "standalone reproducer for them yet — replay the bundle with `fuzz replay`")
            out.append(r)
            open_ = r["name"]
        elif r["op"] == "await":
            if r.get("name") != open_ or r.get("point", "done") != "done":
                raise UserError("an operation awaited part way: no standalone reproducer for it yet — replay the "
                                "bundle with `fuzz replay`")
            open_ = None
        elif r["op"] == "complete":
            if open_ is not None:
                raise UserError("a request sent while a submitted one runs: no standalone reproducer for it yet")
            out.append(r)
        else:
            raise UserError(f"the server worker's {r['op']!r} request has no script line yet: replay the bundle "
                            "with `fuzz replay`")
    return out


def body(r: dict[str, Any]) -> str:
    """A /completion request's JSON, as the server worker sends it, not streamed (a submitted one pinned to its
    slot, as the worker's stream is)."""
    from targets.llama_server_worker import completion_body

    b = completion_body(r, stream=False)
    return json.dumps({**b, "id_slot": int(r["slot"])} if int(r.get("slot", -1)) >= 0 else b, separators=(",", ":"))


def lines_of(r: dict[str, Any]) -> list[str]:
    """One request's script lines."""
    if r["op"] == "complete":
        posts = [f"post /embedding '{json.dumps({'content': q['prompt']}, separators=(',', ':'))}' >/dev/null"
                 if q.get("embed") else f"post /completion '{body(q)}' >/dev/null" for q in r["requests"]]
        if not r.get("concurrent") or len(posts) < 2:
            return posts
        return [*(p + " &" for p in posts), "wait"]
    if r["kind"] == "complete":
        return [f"post /completion '{body(r)}' >/dev/null"]
    file = json.dumps({"filename": f"{r.get('file', r['name'])}.bin"}) if r["kind"] in ("save", "restore") else "{}"
    return [f"post '/slots/{r.get('slot', 0)}?action={r['kind']}' '{file}' >/dev/null"]


def answer_script(run: dict[str, Any], title: str) -> str:
    """repro.sh of a wrong answer: the requests to the finding's server, its answer to the last, against the same
    prompt's answer from a llama-server that caches nothing."""
    *before, last = run["steps"]
    mine = [x for x in last.get("requests", [last]) if x.get("prompt") == run["prompt"]][0]
    others = [x for x in last.get("requests", []) if x is not mine]
    side = last.get("concurrent") and others  # (its round's other requests beside it, else the ones before it)
    if not side:
        others = others[:last.get("requests", []).index(mine)] if others else []
    q = {k: mine[k] for k in ("prompt", "n_predict", "slot") if k in mine}
    alone = {k: v for k, v in q.items() if k != "slot"}
    flags = " ".join(run["flags"])
    return "\n".join([
        "#!/bin/sh", f"# {title}.", "#",
        f"# llama.cpp {run['commit']}: llama-server (LLAMA_SERVER, else the one on PATH) on the model beside this",
        "# file, sent the requests below one after another; its answer to the last against the same prompt's from a",
        "# llama-server that caches nothing (one slot, --cache-ram 0, cache_prompt false). Exits 1 while they differ",
        "# (the defect), 0 once they agree, 2 when it cannot run (no llama-server, no curl, a request failed).",
        'server=${LLAMA_SERVER:-llama-server}', 'port=${PORT:-18181}', 'dir=$(cd "$(dirname "$0")" && pwd)',
        'command -v "$server" >/dev/null 2>&1 || { echo "cannot run: no $server (set LLAMA_SERVER)"; exit 2; }',
        'command -v curl >/dev/null 2>&1 || { echo "cannot run: no curl"; exit 2; }',
        'log=$(mktemp); slots=$(mktemp -d)  # what llama-server printed; where it saves slots',
        "start() {  # llama-server with these flags, once it answers /health",
        '  GGML_NO_BACKTRACE=1 "$server" -m "$dir/model.gguf" --host 127.0.0.1 --port "$port" --slot-save-path '
        '"$slots" "$@" >"$log" 2>&1 &',
        "  pid=$!; i=0",
        '  until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do',
        '    kill -0 $pid 2>/dev/null || { echo "cannot run: llama-server exited as it started; see $log"; exit 2; }',
        "    i=$((i + 1)); [ $i -lt 600 ] || { kill $pid; echo \"cannot run: llama-server did not start\"; exit 2; }",
        "    sleep 0.1", "  done", "}",
        "stop() { kill $pid 2>/dev/null; wait $pid 2>/dev/null; }",
        "post() {  # POST $2 to $1",
        "  curl -sf -X POST \"http://127.0.0.1:$port$1\" -H 'Content-Type: application/json' -d \"$2\" || "
        '{ echo "cannot run: a request to $1 failed; see $log"; stop; exit 2; }', "}",
        "tokens() { sed -n 's/.*\"tokens\":\\[\\([^]]*\\)\\].*/\\1/p'; }", "",
        f"start {flags}",
        *own_waits([x for r in before for x in lines_of(r)]),
        *own_waits([f"post /completion '{body(x)}' >/dev/null" + (" &" if side else "") for x in others]),
        f"got=$(post /completion '{body(q)}' | tokens)", *(own_waits(["wait"]) if side else []), "stop", "",
        "# the reference: the same prompt alone, nothing cached",
        f"start -np 1 -c {run['flags'][run['flags'].index('-c') + 1]} --cache-ram 0 --no-webui --no-warmup -fit off",
        f"want=$(post /completion '{body({**alone, 'cache_prompt': False})}' | tokens)",
        "stop",
        '[ -n "$want" ] || { echo "cannot run: no answer from the reference"; exit 2; }',
        'if [ "$got" != "$want" ]; then',
        '  echo "DEFECT: the last request is answered [$got]; the same prompt, nothing cached, [$want]"; exit 1',
        "fi",
        'echo "fixed: the last request is answered [$got], as the same prompt with nothing cached"', "exit 0", ""])
