"""certificate.json and `family-certify admit`: what a run certifies per architecture (boundaries certified and
refused, the row refused by a lane that names no cut, no certificate when a planned lane did not run), and admission
of a real GGUF by its architecture, layer pattern, cuts and build — one line, exit 0 / 1 / 2."""

import json

import pytest

from fuzz.certify.certificate import admit, boundary, certificate, even_cuts, layer_letters, roster
from fuzz.certify.schemas import validate
from synth.errors import UserError
from synth.make import resolve, write_fixture
from synth.manifest import load_manifest
from synth.spec import Knobs

from conftest import ROOT, run_cli

JAMBA = [{"kind": "recurrent", "swa": False}] * 4 + [{"kind": "attention", "swa": False}] + \
    [{"kind": "recurrent", "swa": False}] * 3  # the jamba row's fixture: RRRRARRR


def lane(name, status, *reports, detail=""):
    return {"row": "jamba", "lane": name, "status": status, "detail": detail, "seconds": 1.0, "reports": list(reports)}


def report(oracle, *results, **extra):
    return {"oracle": oracle, "arch": "jamba", "layers": JAMBA, "status": "pass", "results": list(results), **extra}


def cut(c, status="pass"):
    return {"cuts": [c], "status": status}


def a_run(*lanes):
    m = load_manifest()
    build = {"llama_cpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f", "toolkit": "0.1.0", "spec": "pinned"}
    return {"command": "family-certify run jamba", "target": "llama-cpp", "build": build,
            "manifest": {"path": str(m.path), "sha256": "0" * 64}, "results": list(lanes)}, m


def test_a_failing_cut_refuses_its_boundary_and_a_passing_one_certifies_it_by_lane():
    run, m = a_run(lane("boundary-sweep", "pass", report("sweep", *map(cut, range(1, 6)))),
                   lane("handoff", "finding", report("handoff", cut(1), cut(2), cut(3), cut(4, "finding"), cut(5))),
                   lane("wire", "pass", report("wire", cut(1), config={"wire": "f16"}),
                        report("wire", cut(1), status="numerics", config={"wire": "q8_0"})))
    cert = certificate(run, m)
    validate(cert, "certificate")
    row = cert["architectures"]["jamba"]["rows"]["jamba"]
    assert row["kinds"] == "RRRRARRR" and row["status"] == "certified" and row["recipe"]["family"] == "jamba"
    assert row["boundaries"] == {"certified": {"A|R": ["boundary-sweep", "handoff"],
                                               "R|R": ["boundary-sweep", "handoff", "wire"]},
                                 "refused": {"R|A": "handoff (handoff) at cuts [4]: finding"}}
    assert row["wire"] == {"granted": ["f16"], "measured": {"q8_0": "numerics"}}
    assert row["state"] == ["kv", "recurrent"] and row["lanes"]["handoff"] == "finding"
    assert {"row": "gpt2", "arch": "gpt2", "why": "tier 3: Legacy arch, superseded many times over"} \
        in cert["refused_families"]


def test_a_lane_failing_without_a_cut_refuses_the_row_and_a_missing_lane_writes_no_certificate():
    run, m = a_run(lane("boundary-sweep", "pass", report("sweep", cut(1))),
                   lane("isolation", "finding", report("isolation"), detail="sequence 1 moved"))
    row = certificate(run, m)["architectures"]["jamba"]["rows"]["jamba"]
    assert row["status"] == "refused" and row["refused_because"] == "isolation: finding: sequence 1 moved"
    run, m = a_run(lane("boundary-sweep", "pass", report("sweep", cut(1))), lane("handoff", "missing"))
    assert certificate(run, m) is None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("admit")
    out = {}
    for name, family, knobs in (("jamba24", "jamba", {"layers": 24, "period": 8}),
                                ("jamba24p6", "jamba", {"layers": 24, "period": 6}),
                                ("qwen3", "qwen3", {"layers": 4}), ("gpt2", "gpt2", {})):
        write_fixture(resolve(family, Knobs(**knobs)), d / f"{name}.gguf")
        out[name] = d / f"{name}.gguf"
    (d / "corrupt.gguf").write_bytes(out["jamba24"].read_bytes()[:4000])
    out["corrupt"] = d / "corrupt.gguf"
    run, m = a_run(lane("handoff", "finding", report("handoff", *map(cut, range(1, 4)), cut(4, "finding"), cut(5))))
    cert = certificate(run, m)
    (d / "certificate.json").write_text(json.dumps(cert))
    out["cert"] = d / "certificate.json"
    return out, cert


def test_admit_answers_by_architecture_pattern_boundary_and_build(models):
    paths, cert = models
    assert layer_letters([{"kind": "attention", "swa": True}, {"kind": "mlp"}]) == "SM" and \
        boundary("RRRRARRR", 4) == "R|A" and even_cuts(24, 3) == [8, 16]
    ok, line = admit(paths["jamba24"], cert, [10, 13])
    assert ok and line.startswith("admitted: jamba24.gguf (jamba, 24 layers) at cuts 10, 13: certificate row jamba "
                                  "on build 0c1e57098bba: A|R by handoff; R|R by handoff"), line
    assert admit(paths["jamba24"], cert, [10, 12]) == (False, "refused: jamba24.gguf (jamba, 24 layers) at cuts 10, "
                                                              "12: row jamba: cut 12 (R|A) refused: handoff (handoff) "
                                                              "at cuts [4]: finding")
    ok, line = admit(paths["jamba24p6"], cert, [10])
    assert not ok and "its layer pattern RRRARRRRRARR" in line and \
        line.endswith("(the rows' fixtures at that depth: jamba RRRRARRRRRRRARRRRRRRARRR)"), line
    assert admit(paths["qwen3"], cert, [2])[1].endswith("no certificate row for architecture qwen3")
    assert admit(paths["gpt2"], cert, [1])[1].endswith("a refused family (tier 3: Legacy arch, superseded many "
                                                       "times over)")
    assert admit(paths["jamba24"], cert, [10], build="0c1e570")[0]
    assert admit(paths["jamba24"], cert, [10], build="deadbeef") == (
        False, "refused: jamba24.gguf (jamba, 24 layers) at cuts 10: the certificate is for build 0c1e57098bba, "
               "not deadbeef")


def test_admit_on_the_command_line_is_one_line_exit_0_1_or_2(models, tmp_path):
    paths, _ = models
    cert = str(paths["cert"])
    for args, code, start in (([str(paths["jamba24"]), "--cuts", "10"], 0, "admitted: "),
                              ([str(paths["jamba24"]), "--stages", "2"], 1, "refused: "),  # cut 12: R|A
                              ([str(paths["qwen3"])], 1, "refused: "),
                              ([str(paths["jamba24"]), "--cuts", "10", "--build", "deadbeef"], 1, "refused: "),
                              ([str(paths["corrupt"])], 2, "family-certify: error: "),
                              ([str(paths["jamba24"]), "--cuts", "30"], 2, "family-certify: error: cuts [30]"),
                              ([str(paths["jamba24"]), "--cuts", "x"], 2, "family-certify: error: --cuts 'x'")):
        r = run_cli("family-certify", "admit", *args, "--certificate", cert)
        text = (r.stdout + r.stderr).strip()
        assert r.returncode == code and len(text.splitlines()) == 1 and text.startswith(start), (args, text)
    (tmp_path / "certificate.json").write_text('{"schema": 1, "kind": "family-certify-certificate"}')
    r = run_cli("family-certify", "admit", str(paths["jamba24"]), "--certificate", str(tmp_path))
    assert r.returncode == 2 and "not a family-certify certificate" in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.llama
def test_a_run_against_the_b1_mutant_certifies_jamba_except_where_a_stage_starts_on_attention(tmp_path, models):
    """The acceptance of the certificate: b1-first-layer-probe (a stage that starts on an attention layer loses the
    recurrent state before it) fails the jamba row's hand-off at cut 4 (R|A); the certificate refuses R|A, certifies
    R|R and A|R, and admit refuses a 24-layer jamba at an attention-first cut and admits it at another."""
    paths, _ = models
    out = tmp_path / "out"
    r = run_cli("family-certify", "run", "jamba", "--lane", "boundary-sweep", "--lane", "handoff", "--target",
                "mutant:b1-first-layer-probe", "--out", str(out), cwd=ROOT)
    assert r.returncode == 1 and "certificate.json" in r.stdout, r.stdout + r.stderr
    cert = json.loads((out / "certificate.json").read_text())
    validate(cert, "certificate")
    row = cert["architectures"]["jamba"]["rows"]["jamba"]
    assert set(row["boundaries"]["certified"]) == {"A|R", "R|R"} and list(row["boundaries"]["refused"]) == ["R|A"]
    assert run_cli("family-certify", "admit", str(paths["jamba24"]), "--certificate", str(out), "--cuts",
                   "12").returncode == 1
    assert run_cli("family-certify", "admit", str(paths["jamba24"]), "--certificate", str(out), "--cuts",
                   "10").returncode == 0


def test_the_roster_has_skippys_shape_and_only_architectures_certified_at_every_boundary(tmp_path):
    """tests/data/skippy-split-certified.json has the shape skippy reads (mesh-llm's SplitCertificationRoster:
    schema_version 2, native_recipe {llama_upstream_sha, skippy_abi, patch_queue_sha256}, architectures). skippy
    admits by architecture at any cut, so a row with a refused boundary keeps its architecture out."""
    shape = json.loads((ROOT / "tests" / "data" / "skippy-split-certified.json").read_text())
    clean, m = a_run(lane("handoff", "pass", report("handoff", *map(cut, range(1, 6)))))
    cert = certificate(clean, m)
    got = roster(cert, skippy_abi="0.1.67", patch_queue_sha256="ab" * 32)
    assert got.keys() == shape.keys() and got["native_recipe"].keys() == shape["native_recipe"].keys()
    assert got["schema_version"] == shape["schema_version"] == 2 and got["architectures"] == ["jamba"]
    assert got["native_recipe"] == {"llama_upstream_sha": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                                    "skippy_abi": "0.1.67", "patch_queue_sha256": "ab" * 32}
    refused, m = a_run(lane("handoff", "finding", report("handoff", cut(1), cut(4, "finding"))))
    assert roster(certificate(refused, m), skippy_abi="0.1.67", patch_queue_sha256="ab" * 32)["architectures"] == []
    with pytest.raises(UserError, match="does not say its build's skippy_abi .a run on skippy records it.; give "
                                        "--skippy-abi"):
        roster(cert)
    sdist = {**cert, "build": {**cert["build"], "llama_cpp_commit": None}}  # a tree without git history
    with pytest.raises(UserError, match="its build's llama_upstream_sha .a build from a tree without git history, "
                                        "an sdist's, has no commit.; give --llama-upstream-sha"):
        roster(sdist, skippy_abi="0.1.67", patch_queue_sha256="ab" * 32)
    assert roster(sdist, "0.1.67", "ab" * 32, llama_upstream_sha="c" * 40)["native_recipe"]["llama_upstream_sha"] == \
        "c" * 40
    (tmp_path / "certificate.json").write_text(json.dumps(cert))
    r = run_cli("family-certify", "roster", str(tmp_path), "--skippy-abi", "0.1.67", "--patch-queue-sha256", "0" * 64)
    assert r.returncode == 0 and json.loads(r.stdout)["architectures"] == ["jamba"], r.stdout + r.stderr
    (tmp_path / "certificate.json").write_text(json.dumps(sdist))
    r = run_cli("family-certify", "roster", str(tmp_path), "--skippy-abi", "0.1.67", "--patch-queue-sha256", "0" * 64)
    assert r.returncode == 2 and r.stderr.strip().endswith("give --llama-upstream-sha"), r.stderr
    r = run_cli("family-certify", "roster", str(tmp_path), "--skippy-abi", "0.1.67", "--patch-queue-sha256", "0" * 64,
                "--llama-upstream-sha", "c" * 40)
    assert r.returncode == 0 and json.loads(r.stdout)["native_recipe"]["llama_upstream_sha"] == "c" * 40, r.stderr


def test_an_unsupported_stage_refuses_its_boundary_with_why_and_known_findings_are_listed():
    """A stage contract (llama.cpp cannot run the stage: result `unsupported` with a reason) refuses the boundary with
    that reason; a row with no certified boundary is refused; the memory lane's known repros are listed."""
    run, m = a_run(lane("parity", "unsupported", report("sweep", *({"cuts": [c], "status": "unsupported",
                                                                   "reason": "stage 1:8: no embedding input"}
                                                                  for c in (1, 4)))),
                   lane("memory", "known", report("memory"))
                   | {"data": {"known": ["corpora/repros/llama-memory-seq-keep-per-stream"]}})
    row = certificate(run, m)["architectures"]["jamba"]["rows"]["jamba"]
    assert row["boundaries"] == {"certified": {}, "refused": {
        "R|A": "unsupported (parity): stage 1:8: no embedding input",
        "R|R": "unsupported (parity): stage 1:8: no embedding input"}}
    assert row["status"] == "refused" and row["refused_because"].startswith("no cut certified: unsupported (parity)")
    assert row["known"] == ["corpora/repros/llama-memory-seq-keep-per-stream"]
