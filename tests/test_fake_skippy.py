"""The fake skippy (tests/fake_skippy: a test double of skippy for the adapter's contract tests) does what it
promises: a split chain of serve-binary stages answers exactly as serve-openai, its kv_cache restores exactly,
each FAKE_SKIPPY_BUG shows, dropped families are refused, and the worker's tokenizer ops it relies on work."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from synth.make import write_fixture
from synth.manifest import load_manifest

from conftest import ROOT

pytestmark = pytest.mark.llama

BIN = ROOT / "tests" / "fake_skippy" / "bin"
PROMPT = "abaababbab"
KV = {"mode": "lookup-record", "payload": "auto", "max_entries": 8, "max_bytes": 0, "min_tokens": 4}


def bug_env(bug: str | None) -> dict[str, str]:
    """This environment with FAKE_SKIPPY_BUG set to bug (None: a correct fake)."""
    env = {k: v for k, v in os.environ.items() if k != "FAKE_SKIPPY_BUG"}
    return {**env, "FAKE_SKIPPY_BUG": bug} if bug else env


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """row name -> the fixture of that family_tiers.toml row."""
    root, made = tmp_path_factory.mktemp("fake-skippy-rows"), {}

    def make(name: str) -> Path:
        if name not in made:
            made[name] = root / f"{name}.gguf"
            write_fixture(load_manifest(None).row(name).spec(), made[name])
        return made[name]

    return make


@pytest.fixture
def procs():
    """Start fake processes; every one is stopped (SIGTERM, then SIGKILL) at the end of the test."""
    started: list[subprocess.Popen] = []

    def start(prog: str, *args: str, bug: str | None = None, log: Path | None = None) -> subprocess.Popen:
        p = subprocess.Popen([str(BIN / prog), *args], stdout=subprocess.DEVNULL,
                             stderr=log.open("w") if log else subprocess.DEVNULL, env=bug_env(bug))
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return what()
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"not ready within {timeout}s")


def models(p: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{p}/v1/models", timeout=5) as r:
        return json.load(r)


def complete(p: int, prompt: str, timeout: float = 60, **extra) -> tuple[int, dict]:
    body = {"model": "m", "prompt": prompt, "max_tokens": 8, "temperature": 0, "seed": 1, "top_k": 1,
            "stream": False, **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{p}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def serve_openai(procs, model: Path) -> int:
    p = port()
    procs("skippy", "serve-openai", "--model-path", str(model), "--bind-addr", f"127.0.0.1:{p}", "--model-id", "m",
          "--ctx-size", "512", "--some-future-flag", "1")
    wait_for(lambda: models(p))
    return p


def serve_chain(procs, tmp_path: Path, model: Path, cut: int, n_layer: int, *, bug: str | None = None) -> int:
    """Two serve-binary stages [0, cut), [cut, n_layer) with the kv_cache on; stage 1 started first. The API port."""
    ports, api = [port(), port()], port()
    for i, (a, b) in reversed(list(enumerate([(0, cut), (cut, n_layer)]))):
        cfg = {"run_id": "run", "topology_id": "topo", "model_id": "m", "model_path": str(model),
               "stage_id": f"stage-{i}", "stage_index": i, "layer_start": a, "layer_end": b,
               "load_mode": "runtime-slice", "bind_addr": f"127.0.0.1:{ports[i]}", "ctx_size": 512, "lane_count": 1,
               "n_batch": 64, "n_ubatch": 64, "upstream": None, "kv_cache": KV,
               "downstream": {"stage_id": "stage-1", "stage_index": 1, "endpoint": f"tcp://127.0.0.1:{ports[1]}"}
               if i == 0 else None}
        path = tmp_path / f"{bug}-{cut}-stage-{i}.json"
        path.write_text(json.dumps(cfg))
        extra = ["--openai-bind-addr", f"127.0.0.1:{api}", "--openai-model-id", "m"] if i == 0 else []
        procs("skippy", "serve-binary", "--config", str(path), *extra, bug=bug)
        if i == 1:
            wait_for(lambda: socket.create_connection(("127.0.0.1", ports[1]), timeout=1).close())
    assert wait_for(lambda: models(api))["data"][0] == {"id": "m", "object": "model", "created": 0,
                                                        "owned_by": "skippy-runtime"}
    return api


def text(reply: tuple[int, dict]) -> str:
    status, body = reply
    assert status == 200, body
    return body["choices"][0]["text"]


def correctness(*args: str, bug: str | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = Path(args[args.index("--report-out") + 1])
    r = subprocess.run([str(BIN / "skippy-correctness"), *args], capture_output=True, text=True, env=bug_env(bug),
                       timeout=120)
    return r, json.loads(out.read_text()) if out.is_file() else None


def test_worker_tokenizes_with_the_models_vocabulary(llama, rows):
    """The worker ops the fake tokenizes with: the fixtures' gpt2 BPE (a, b, ab, t3, ...; merge "a b")."""
    assert llama.load(str(rows("qwen3"))).ok
    assert llama.call("tokenize", text=PROMPT).data["tokens"] == [2, 0, 2, 2, 1, 2]  # ab a ab ab b ab
    assert llama.call("tokenize", text="").data["tokens"] == []
    assert llama.call("detokenize", tokens=[2, 0, 3, 63]).data["text"] == "abat3t63"
    bad = llama.call("detokenize", tokens=[10_000])
    assert not bad.ok and bad.failure.error_kind == "bad_request"


def test_version_and_dropped_families_are_refused(rows, tmp_path):
    v = subprocess.run([str(BIN / "skippy"), "--version"], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.startswith("skippy 0.0.0-fake (commit ") and "llama.cpp 0c1e570" in v.stdout
    gpt2 = str(rows("gpt2"))
    refused = "Error: Unsupported: runtime-slice execution is not supported for this model architecture yet (gpt2)"
    r = subprocess.run([str(BIN / "skippy"), "serve-openai", "--model-path", gpt2, "--bind-addr", "127.0.0.1:1"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr.strip()) == (1, refused)
    r, rep = correctness("single-step", "--model", gpt2, "--split-layer", "1", "--prompt", PROMPT,
                         "--report-out", str(tmp_path / "r.json"))
    assert (r.returncode, r.stderr.strip(), rep) == (1, refused, None)


def test_chain_equals_serve_openai_and_its_cache_restores_exactly(procs, rows, tmp_path):
    """jamba (8 layers, attention at layer 4), cut at 4: stage 1 starts on the attention layer. The chain answers
    as the whole model; a request extending a recorded prompt restores it and still answers the same — unless
    the kv_cache payload `auto` is resolved by B1's first-layer probe (drops-recurrent)."""
    jamba = rows("jamba")
    whole = serve_openai(procs, jamba)
    first, second = PROMPT * 3, PROMPT * 4
    want = text(complete(whole, second))
    api = serve_chain(procs, tmp_path, jamba, 4, 8)
    assert text(complete(api, first)) == text(complete(whole, first))
    status, body = complete(api, second)
    assert body["usage"] == {"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32,
                             "prompt_tokens_details": {"cached_tokens": 17}}  # the first prompt but its last token
    assert text((status, body)) == want
    buggy = serve_chain(procs, tmp_path, jamba, 4, 8, bug="drops-recurrent")
    text(complete(buggy, first))
    status, body = complete(buggy, second)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 17
    assert text((status, body)) != want  # stage 1's recurrent state came back zeroed
    assert complete(whole, first, logprobs=1) == (400, {"error": {
        "message": "completion logprobs are parsed by openai-frontend but not yet implemented by skippy runtime",
        "type": "invalid_request_error", "param": None, "code": "unsupported_model_feature"}})


def test_hangs_and_exits_on_sigterm(procs, rows):
    p = serve_openai(procs, rows("qwen3"))
    server = port()
    proc = procs("skippy", "serve-openai", "--model-path", str(rows("qwen3")), "--bind-addr", f"127.0.0.1:{server}",
                 "--model-id", "m", bug="hangs")
    wait_for(lambda: models(server))
    with pytest.raises(TimeoutError):
        complete(server, PROMPT, timeout=1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(5) == 0
    assert complete(p, PROMPT)[0] == 200


def test_correctness_lanes_pass_and_catch_truncated_kv(rows, tmp_path):
    """single-step passes; state-handoff of laguna (K/V heads 1 on layer 0, 2 elsewhere) passes, and with B5's
    truncated KV export the restored stage's output differs (exit 1, skippy's mismatch line)."""
    laguna = str(rows("laguna"))
    common = ["--model", laguna, "--model-id", "laguna", "--stage-load-mode", "runtime-slice", "--layer-end", "8",
              "--prompt", PROMPT * 3, "--stage-server-bin", "/nonexistent/skippy"]
    r, rep = correctness("single-step", *common, "--split-layer", "4", "--report-out", str(tmp_path / "a/s.json"))
    assert r.returncode == 0, r.stderr
    assert rep["status"] == "pass" and rep["matches"] and json.loads(r.stdout) == rep
    assert rep["split"]["boundary"] == {"producer_stage_index": 0, "layer_start": 0, "layer_end": 4, "token_count": 18,
                                        "payload_bytes": 18 * 32 * 4, "wire_payload_bytes": 18 * 32 * 4}
    handoff = [*common, "--state-layer-start", "0", "--state-layer-end", "8", "--state-payload-kind", "full-state",
               "--prefix-token-count", "9", "--cache-hit-repeats", "2", "--activation-width", "32",
               "--report-out", str(tmp_path / "h.json")]
    r, rep = correctness("state-handoff", *handoff)
    assert r.returncode == 0 and rep["matches"] and rep["status"] == "pass", (r.stderr, rep)
    r, rep = correctness("state-handoff", *handoff, bug="truncates-kv")
    assert r.returncode == 1 and r.stderr.strip() == "Error: staged execution did not match full-model baseline"
    assert rep["status"] == "fail" and not rep["matches"] and not rep["restored_output_matches"]
    r, rep = correctness("single-step", *common, "--split-layer", "4", "--report-out", str(tmp_path / "m.json"),
                         bug="malformed-report")
    assert r.returncode == 0 and "matches" not in rep and "status" not in rep
