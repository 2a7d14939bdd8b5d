"""A certificate a split runtime can read at serving time, and `admit`, which answers from it.

`family-certify run/scan/aggregate --out DIR` writes `certificate.json` (schemas/certificate.schema.json) next to
report.json when the run executed every row × lane it planned (a run with a missing lane writes none). Per GGUF
architecture the run covered, per manifest row: the fixture's layer pattern, each lane's status, the stage
boundaries certified and refused, the wire types granted (the f16 gate) and measured, the state that crosses a cut,
the known upstream findings that apply; beside them the build, the manifest's sha256, and the manifest's refused
families (tier 3, rows the pinned llama.cpp cannot run).

A boundary is where a cut falls, named by the layers on either side: `R|A` is a stage that ends on a recurrent
layer and a stage that starts on an attention layer (A attention, S sliding-window attention, R recurrent, B both
in one layer, M feed-forward only). A fixture's cut is certified when every lane result that cut it passed; a
failing result refuses the boundaries of its cuts, and so does an unsupported one (a stage contract: llama.cpp cannot
run that stage, with why); a lane that failed without naming a cut, or no certified cut at all, refuses the row.

`admit MODEL.gguf` reads the real GGUF (architecture, layer kinds) and answers for a set of cuts: admitted (exit
0) when a certified row of its architecture has its layer pattern and every cut's boundary is certified there;
refused (exit 1) otherwise, naming why.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fuzz.certify.schemas import validate
from fuzz.engine.contract import FAILING, KNOWN, MISSING, PASS, UNSUPPORTED, build_name
from fuzz.engine.stages import KIND_LETTER
from synth.errors import UserError, read_json
from synth.inspect import inspect_file
from synth.make import resolve, write_fixture
from synth.manifest import Manifest, recipe_knobs

CERT_SCHEMA = 1


def layer_letters(layers: Iterable[Any]) -> str:
    """One letter per layer (the stages' KIND_LETTER; S for a sliding-window attention layer), from a report's
    `layers` or from synth.inspect's LayerInfo."""
    out = []
    for x in layers:
        kind, swa = (x["kind"], x.get("swa")) if isinstance(x, dict) else (x.kind, x.swa)
        out.append("S" if kind == "attention" and swa else KIND_LETTER[kind])
    return "".join(out)


def boundary(letters: str, cut: int) -> str:
    return f"{letters[cut - 1]}|{letters[cut]}"


def row_certificate(lanes: list[dict[str, Any]], known: dict[str, str], indexer: bool) -> dict[str, Any]:
    """One row's entry from its lane results (each with its oracle reports)."""
    letters = ""
    certified: dict[str, set[str]] = {}  # boundary → the lanes that passed a cut there
    refused: dict[str, str] = {}
    statuses = {x["lane"]: x["status"] for x in lanes}
    wire: dict[str, str] = {}
    uncut: list[str] = []  # failing lanes that named no cut: they refuse the row
    for x in lanes:
        cut_failures = 0
        for rep in x.get("reports", []):
            if rep.get("layers") and not letters:
                letters = layer_letters(rep["layers"])
            if rep.get("oracle") == "wire" and rep.get("config", {}).get("wire"):
                wire[str(rep["config"]["wire"])] = rep["status"]
            for res in rep.get("results", []):
                cuts = res.get("cuts")
                if not cuts or not letters or max(cuts) >= len(letters):
                    continue
                names = {boundary(letters, c) for c in cuts}
                if res.get("status") == UNSUPPORTED:  # a stage contract: llama.cpp cannot run this stage
                    for name in names:
                        refused.setdefault(name, f"unsupported ({x['lane']}): {res.get('reason', '')}")
                elif res.get("status") in FAILING:
                    cut_failures += 1
                    for name in names:
                        refused.setdefault(name, f"{x['lane']} ({rep['oracle']}) at cuts {cuts}: "
                                                 f"{res.get('status')}")
                elif res.get("status") == PASS:
                    for name in names:
                        certified.setdefault(name, set()).add(x["lane"])
        if x["status"] in FAILING and not cut_failures:
            uncut.append(f"{x['lane']}: {x['status']}: {x.get('detail', '')}"[:300])
    kinds = set(letters)
    # the fixture the lanes ran, and the planner's choices (run --cuts planner:CMD), from the lanes' data
    data = {k: v for x in lanes for k, v in (x.get("data") or {}).items() if k in ("fixture_sha256", "planner")}
    ok = {k: sorted(v) for k, v in sorted(certified.items()) if k not in refused}
    why = uncut[0] if uncut else "no lane reported the fixture's layers" if not letters else \
        None if ok else "no cut certified" + (f": {next(iter(refused.values()))}" if refused else "")
    return {
        "kinds": letters,
        "status": "refused" if why else "certified",
        **({"refused_because": why} if why else {}),
        "lanes": statuses,
        "boundaries": {"certified": ok, "refused": dict(sorted(refused.items()))},
        "wire": {"granted": ["f16"] if wire.get("f16") == PASS else [],
                 "measured": {k: v for k, v in sorted(wire.items()) if k != "f16"}},
        "state": [name for name, has in (("kv", kinds & set("ASB")), ("recurrent", kinds & set("RB")),
                                         ("indexer", indexer)) if has],
        "known": sorted({known[x["lane"]] for x in lanes if x["status"] == KNOWN and x["lane"] in known}
                        | {k for x in lanes if x["status"] == KNOWN for k in (x.get("data") or {}).get("known", [])}),
        **({"fixture_sha256": data["fixture_sha256"]} if data.get("fixture_sha256") else {}),
        **({"planner": [{"stages": p["stages"], "chose": p["chose"], "refused": [r["cuts"] for r in p["refused"]]}
                        for p in data["planner"]]} if data.get("planner") else {}),
    }


def certificate(run: dict[str, Any], manifest: Manifest) -> dict[str, Any] | None:
    """The run's certificate, or None when a planned lane did not run (a certificate claims what was executed)."""
    if any(x["status"] == MISSING for x in run["results"]):
        return None
    archs: dict[str, dict[str, Any]] = {}
    by_row: dict[str, list[dict[str, Any]]] = {}
    for x in run["results"]:
        by_row.setdefault(x["row"], []).append(x)
    for key, lanes in by_row.items():
        row = manifest.rows.get(key)
        if row is None or not row.runnable:
            continue
        entry = {"recipe": row.recipe, **row_certificate(lanes, row.known, row.spec().indexer)}
        arch = next((rep["arch"] for x in lanes for rep in x.get("reports", []) if rep.get("arch")), row.arch)
        archs.setdefault(arch, {"rows": {}})["rows"][key] = entry
    refused = [{"row": r.key, "arch": r.arch, "why": f"tier 3: {r.why}" if r.tier == 3 else str(r.reason)}
               for r in manifest.rows.values() if r.tier == 3 or not r.runnable]
    return {"schema": CERT_SCHEMA, "kind": "family-certify-certificate", "command": run["command"],
            "target": run["target"], "build": run["build"], "manifest": run["manifest"],
            "architectures": dict(sorted(archs.items())), "refused_families": refused}


def read_certificate(path: Path) -> dict[str, Any]:
    f = path / "certificate.json" if path.is_dir() else path
    if not f.is_file():
        raise UserError(f"{path}: no certificate.json; pass one written by `family-certify run --out DIR`")
    data = read_json(f, "certificate", "re-run family-certify run --out")
    from jsonschema import ValidationError  # (here: every command would pay its import otherwise)

    try:
        validate(data, "certificate")
    except ValidationError as e:
        raise UserError(f"{f}: not a family-certify certificate (schema {CERT_SCHEMA}: {e.message[:120]}); re-run "
                        "family-certify run --out") from None
    return data


def even_cuts(n_layer: int, stages: int) -> list[int]:
    """Where K stages of as equal a size as can be split n_layer layers."""
    return [round(i * n_layer / stages) for i in range(1, stages)]


def pattern_at(recipe: dict[str, Any], n_layer: int) -> str:
    """The layer letters the row's fixture has when made n_layer deep: the pattern (interleaving period and offset,
    sliding-window layers) a model of that depth must have to be the fixture's kind of model."""
    spec = resolve(str(recipe["family"]), replace(recipe_knobs(recipe), layers=n_layer))
    with tempfile.TemporaryDirectory(prefix="family-certify-admit-") as d:
        write_fixture(spec, Path(d) / "pattern.gguf")
        return layer_letters(inspect_file(str(Path(d) / "pattern.gguf")).layers)


def admit(model: Path, cert: dict[str, Any], cuts: list[int] | None, build: str | None = None,
          stages: int = 2) -> tuple[bool, str]:
    """(admitted, one line). cuts None: `stages` stages as equal as can be. build: the build the runtime runs (a
    commit, at least 7 characters, or a build key); None: not checked."""
    info = inspect_file(str(model))
    letters = layer_letters(info.layers)
    if cuts is None:
        cuts = even_cuts(info.n_layer, stages)
    if not cuts or any(not 0 < c < info.n_layer for c in cuts) or sorted(set(cuts)) != cuts:
        raise UserError(f"cuts {cuts}: give increasing cuts between 1 and {info.n_layer - 1} ({model.name} has "
                        f"{info.n_layer} layers)")
    what = f"{model.name} ({info.arch}, {info.n_layer} layers) at cuts {', '.join(map(str, cuts))}"
    have = build_name(cert["build"])
    if build is not None and not (len(build) >= 7 and have.startswith(build)):
        return False, f"refused: {what}: the certificate is for build {have[:12]}, not {build}"
    arch = cert["architectures"].get(info.arch)
    if arch is None:
        why = next((f["why"] for f in cert.get("refused_families", []) if f["arch"] == info.arch), None)
        return False, f"refused: {what}: " + (f"a refused family ({why})" if why else
                                               f"no certificate row for architecture {info.arch}")
    deep = {k: pattern_at(r["recipe"], info.n_layer) for k, r in arch["rows"].items() if r["kinds"]}
    rows = {k: r for k, r in arch["rows"].items() if deep.get(k) == letters}
    if not rows:
        seen = ", ".join(f"{k} {p}" for k, p in deep.items()) or "none"
        return False, (f"refused: {what}: its layer pattern {letters} is not the one any certified fixture has at "
                       f"{info.n_layer} layers (the rows' fixtures at that depth: {seen})")
    at = [(c, boundary(letters, c)) for c in cuts]
    reasons = []
    for key, r in rows.items():
        if r["status"] != "certified":
            reasons.append(f"row {key}: {r['refused_because']}")
            continue
        bad = [(c, name) for c, name in at if name not in r["boundaries"]["certified"]]
        if not bad:
            by = "; ".join(f"{n} by {', '.join(r['boundaries']['certified'][n])}" for n in sorted({n for _, n in at}))
            return True, f"admitted: {what}: certificate row {key} on build {have[:12]}: {by}"
        c, name = bad[0]
        why = r["boundaries"]["refused"].get(name)
        reasons.append(f"row {key}: cut {c} ({name}) " + (f"refused: {why}" if why else "was never certified"))
    return False, f"refused: {what}: {'; '.join(reasons)}"


ROSTER_SCHEMA = 2  # skippy's split-certified.json (mesh-llm, inference/skippy): architectures admitted by name


# where each field of the roster's recipe comes from when the certificate's build does not say it
RECIPE_SOURCES = {"llama_upstream_sha": "a build from a tree without git history, an sdist's, has no commit",
                  "skippy_abi": "a run on skippy records it", "patch_queue_sha256": "a patched build records it"}


def roster(cert: dict[str, Any], skippy_abi: str | None = None, patch_queue_sha256: str | None = None,
           llama_upstream_sha: str | None = None) -> dict[str, Any]:
    """The certificate in the shape of skippy's split certification roster: {schema_version, native_recipe:
    {llama_upstream_sha, skippy_abi, patch_queue_sha256}, architectures}. skippy admits by architecture alone, at
    any cut, so only an architecture whose every row is certified with no boundary refused enters it. The recipe
    comes from the certificate's build (a skippy run records skippy's ABI and llama.cpp) or from the options."""
    build = cert["build"]
    sk = build.get("skippy") or {}
    recipe = {"llama_upstream_sha": llama_upstream_sha or sk.get("llama_cpp") or build.get("llama_cpp_commit"),
              "skippy_abi": skippy_abi or sk.get("abi"),
              "patch_queue_sha256": patch_queue_sha256 or (build.get("patches") or {}).get("sha256")}
    missing = [k for k, v in recipe.items() if not v]
    if missing:
        raise UserError(f"the certificate does not say its build's {missing[0]} ({RECIPE_SOURCES[missing[0]]}); "
                        f"give --{missing[0].replace('_', '-')}")
    archs = sorted(a for a, e in cert["architectures"].items()
                   if all(r["status"] == "certified" and r["boundaries"]["certified"]
                          and not r["boundaries"]["refused"] for r in e["rows"].values()))
    return {"schema_version": ROSTER_SCHEMA, "native_recipe": recipe, "architectures": archs}

