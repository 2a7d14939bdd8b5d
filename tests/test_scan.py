"""The whole matrix on clean upstream (`family-certify scan`): every row of every tier through sweep, the dtype
sweep, wire, hand-off, isolation and determinism (unsplit and chains) at every cut — 0 unexplained findings. What
the pinned llama.cpp does wrong is recorded as `known` rows with repros (corpora/repros); what is numerics says why.

The default suite scans one row of each kind (a hybrid with a known finding, a hybrid swept at every cut, a row
whose every split is unsupported, a tier-2 and a tier-3 row); the whole matrix (about 10 minutes on 2 cores) is
the `scan` marker's, which the nightly scan job runs: it checks the report its scan step wrote
(FAMILY_CERTIFY_SCAN_REPORT, of the rows in FAMILY_CERTIFY_SCAN_ROWS, space-separated; unset: every row), or
scans itself when no report is given (`pytest -m scan`)."""

import json
import os
from pathlib import Path

import pytest

from fuzz.certify.schemas import validate
from synth.manifest import SCAN_LANES, load_manifest

from conftest import ROOT, run_cli

pytestmark = pytest.mark.llama

# kimi-linear: known upstream findings; jamba: a hybrid (period 5) at every cut; glm4: every split unsupported;
# gemma3: tier 2, sliding-window stages; gpt2: tier 3
KINDS = ["kimi-linear", "jamba", "glm4", "gemma3", "gpt2"]


def check_scan(run: dict, keys: list[str]) -> None:
    """A scan's report: every (row, scan lane) ran; only pass, unsupported (with its reason) and the manifest's own
    known findings; every sweep, dtype sweep, wire and hand-off at every cut of the row."""
    validate(run, "certify-run")
    manifest = load_manifest(ROOT / "family_tiers.toml")
    rows = [manifest.row(k) for k in keys if manifest.row(k).runnable]
    assert {(x["row"], x["lane"]) for x in run["results"]} == {(row.key, lane) for row in rows for lane in SCAN_LANES}
    assert set(run["totals"]) <= {"pass", "unsupported", "known"}, run["totals"]
    known = {(x["row"], x["lane"]) for x in run["results"]
             if x["status"] == "known" and x["lane"] not in ("memory", "shift")}
    assert known == {(row.key, lane) for row in rows for lane in row.known if lane in SCAN_LANES}
    for x in run["results"]:  # the memory lanes' known findings are committed repros, matched by cause (any family)
        if x["lane"] in ("memory", "shift") and x["status"] == "known":
            assert f"only upstream's known {x['lane']} bugs: " in x["detail"], x["detail"]
    for x in run["results"]:
        if x["lane"] in ("parity", "dtype-all", "wire-all", "handoff-all") and x["status"] == "pass":
            for rep in x["reports"][:1] if x["lane"] != "dtype-all" else x["reports"]:  # (dtype-all: one per dtype)
                cut_sets = {tuple(c["cuts"]) for c in rep["results"]}
                assert cut_sets == {(c,) for c in range(1, rep["n_layer"])} or cut_sets == {()}, (x["row"], x["lane"])
        if x["status"] == "unsupported":  # with a true reason: a stage contract or the arch's own refusal
            assert "unsupported" in x["detail"] and len(x["detail"]) > 40, x


def test_one_row_of_each_kind_every_oracle_every_cut(tmp_path):
    r = run_cli("family-certify", "scan", *KINDS, "--jobs", "2", "--out", str(tmp_path), timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    run = json.loads((tmp_path / "report.json").read_text())
    check_scan(run, KINDS)
    by = {(x["row"], x["lane"]): x for x in run["results"]}
    assert by[("kimi-linear", "isolation")]["status"] == "known"
    assert by[("glm4", "dtype-all")]["status"] == "unsupported"
    # the dtype sweep: a tier-1 row in its tier's eight dtypes, a tier-2 row in its artifact's (Q4_K_M: q4_k at 256)
    assert by[("jamba", "dtype-all")]["detail"].startswith("cut sets passing per dtype (all): f16 7/7, bf16 7/7")
    assert len(by[("jamba", "dtype-all")]["reports"]) == 8
    assert by[("gpt2", "dtype-all")]["detail"] == "cut sets passing per dtype (all): q4_k@256 3/3"


@pytest.mark.scan
def test_every_row_every_oracle_every_cut(tmp_path):
    manifest = load_manifest(ROOT / "family_tiers.toml")
    keys = os.environ.get("FAMILY_CERTIFY_SCAN_ROWS", "").split() or list(manifest.rows)
    given = os.environ.get("FAMILY_CERTIFY_SCAN_REPORT")
    if given:  # the nightly scan job's own run
        path = Path(given)
        assert path.is_file(), f"FAMILY_CERTIFY_SCAN_REPORT={given}: no such report (did the scan step run?)"
    else:
        r = run_cli("family-certify", "scan", *keys, "--jobs", "2", "--out", str(tmp_path), timeout=3000)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr
        path = tmp_path / "report.json"
    check_scan(json.loads(path.read_text()), keys)
