"""JSON Schemas of what the toolkit writes for others to read: an oracle's report (`--report`, a bundle's
report.json), a family-certify run (`run --out DIR`/report.json, `--report`) and a repro bundle's bundle.json.

The definitions live here once; `schemas/*.schema.json` are generated from them (`python -m fuzz.certify.schemas`) and
committed self-contained (no cross-file references), so a user's CI validates with any JSON Schema tool. A test
keeps the committed files equal to these definitions and validates real outputs against them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fuzz.certify.outputs import RUN_SCHEMA
from fuzz.engine.contract import REPORT_SCHEMA, STATUSES
from fuzz.oracles.registry import ORACLES
from fuzz.repro.bundle import SCHEMA as BUNDLE_SCHEMA

DIR = Path(__file__).resolve().parents[2] / "schemas"
COVERAGE_SCHEMA = 1  # family-certify coverage's coverage.json (fuzz/certify/coverage.py)
MUTATE_SCHEMA = 1  # family-certify mutate's mutate.json (fuzz/certify/mutate.py)
MUTANT_STATUSES = ("killed", "survived", "equivalent", "build-failed", "error")
# the upstream corpus's bug classes (an entry's class, fuzz/certify/corpus.py): defined here, where the corpus
# report's schema enumerates them, since corpus.py sits above this module (it runs the bump, which validates)
CORPUS_CLASSES = {
    "state": "state save/restore (whole context, per sequence, partial)",
    "recurrent": "recurrent and hybrid memory (seq_cp, seq_rm, rollback, co-batched sequences)",
    "swa": "sliding-window caches past the window",
    "ubatch": "ubatch splitting and output order",
    "kv-ops": "KV cache sequence operations (seq_add, seq_div, seq_cp, seq_keep)",
    "server": "llama-server slots, checkpoints and host-RAM prompt cache",
}
DRAFT = "https://json-schema.org/draft/2020-12/schema"

INT_OR_NULL = {"type": ["integer", "null"]}
STR_OR_NULL = {"type": ["string", "null"]}
OBJ_OR_NULL = {"type": ["object", "null"]}
STATUS = {"enum": list(STATUSES)}
ORACLE = {"enum": list(ORACLES)}
CUTS = {"type": "array", "items": {"type": "integer", "minimum": 1}}

BUILD = {"type": "object", "required": ["llama_cpp_commit", "toolkit"], "properties": {
    "llama_cpp_commit": {**STR_OR_NULL, "description": "the llama.cpp commit the target reported (null where the "
                         "tree does not say: a pypi: sdist's vendored tree, a directory that is not a git checkout)"},
    "toolkit": {"type": "string", "description": "family-certify's version"},
    "spec": {"type": "string", "description": "--llama-cpp: pinned, pypi:VERSION or a source tree's path"},
    "llama_cpp_python": {**STR_OR_NULL, "description": "the llama-cpp-python version whose bindings ran it"},
    "patches": {"type": ["object", "null"], "description": "the patch series applied (--patches)",
                "required": ["dir", "files", "sha256"], "properties": {
                    "dir": {"type": "string"}, "files": {"type": "array", "items": {"type": "string"}},
                    "sha256": {"type": "string", "description": "over the patches' names and contents, in order"}}},
    "tree_sha256": {"type": "string", "description": "the source tree after the patches, every file's path and bytes"},
    "bindings_sha256": STR_OR_NULL,
    "options": {"type": "array", "items": {"type": "string"}, "description": "the CMake options it was built with"},
    "backend": {"enum": ["blas", "vulkan", "cuda", "metal"], "description": "--backend: the ggml backend compiled in "
                "beside the CPU one (absent: cpu, no other)"},
    "key": {"type": "string", "description": "its cache key ($FAMILY_CERTIFY_CACHE/builds/KEY)"}}}

FINGERPRINT = {"type": "object", "required": ["oracle", "status", "phase"], "description": "what stays fixed while "
               "shrinking: oracle, status, phase, where, and the kinds of layer at the cut and the divergence",
               "properties": {"oracle": ORACLE, "status": STATUS, "phase": STR_OR_NULL, "stage": {"type": "integer"},
                              "where": {"type": "string",
                                        "description": "boundary or logits; radix: the operation kind or 'schedule'"},
                              "seq": {"type": "integer"},
                              "cut_kinds": {"type": "array", "items": {"enum": ["A", "R", "B", "M"]}},
                              "layer_kind": {"enum": ["A", "R", "B", "M"]},
                              "cause": {"type": "string", "description": "the cause analysis' verdict"},
                              "op": {"type": "string", "description": "memory: the operation whose check failed"},
                              "ops": {"type": "array", "items": {"type": "string"},
                                      "description": "memory: the kinds of operation its shortest program needs"},
                              "memory": {"type": ["string", "null"],
                                         "description": "memory: the memory llama.cpp built (kv, recurrent, hybrid; "
                                                        "-swa, +rollback)"},
                              "cause_op": {"type": "string",
                                           "description": "memory: the operation the cause names (deferred work)"},
                              "cause_then": {"type": "string",
                                             "description": "memory: what ran before that deferred work was done "
                                                            "(export: any state read-out; else the operation); "
                                                            "abort: whether the memory the aborted decode left "
                                                            "holds recurrent state (recurrent) or a KV cache only "
                                                            "(kv)"}},
               "additionalProperties": False}

FINDING = {"type": "object", "required": ["oracle", "status", "message"], "additionalProperties": False,
           "properties": {
               "oracle": ORACLE, "status": STATUS, "message": {"type": "string"},
               "cuts": {**CUTS, "description": "the cut set ([]: the unsplit model)"},
               "stage": {"type": "integer"}, "offset": {"type": "integer"},
               "phase": {"type": "string", "description": "sweep phase, hand-off mode, determinism class, "
                                                          "isolation KV layout or server finding kind"},
               "step": {"type": "integer"}, "position": {"type": "integer"}, "seq": {"type": "integer"},
               "where": {"type": "string"}, "layer": {"type": ["integer", "string"]},
               "node": {"type": "object", "description": "the first graph node whose bits differ"},
               "cause": {"type": "object", "required": ["kind"], "properties": {"kind": {"type": "string"},
                                                                              "detail": {"type": "string"}}},
               "reproduced": {"type": "boolean"}, "fingerprint": FINGERPRINT, "detail": {"type": "object"}}}

RADIX_REPLAY = {"type": "string",  # r1: the fixed tree (a trunk length); r2: a tree drawn for the schedule
                "pattern": "^(r1:[0-9]+:[0-9]+:[0-9]+|r2:[0-9]+:[0-9]+:[^:]+):[^:]+:[A-Za-z.]*$",
                "description": "a radix schedule's replay string (fuzz radix --replay STRING)"}

REPORT = {
    "type": "object", "description": "one oracle run (fuzz ORACLE --report R.json)",
    "required": ["schema", "oracle", "status", "exit_code", "fixture", "sha256", "arch", "n_layer", "kinds", "layers",
                 "target", "build", "llama_cpp_commit", "config", "summary", "results", "findings", "numerics",
                 "timing"],
    "properties": {
        "schema": {"const": REPORT_SCHEMA}, "oracle": ORACLE, "status": STATUS, "exit_code": {"enum": [0, 1]},
        "fixture": {"type": "string"}, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "arch": {"type": "string"}, "n_layer": {"type": "integer", "minimum": 1},
        "kinds": {"type": "string", "pattern": "^[ARBM]+$"},
        "layers": {"type": "array", "items": {"type": "object", "required": ["kind", "swa", "moe"], "properties": {
            "kind": {"enum": ["attention", "recurrent", "both", "mlp"]}, "swa": {"type": "boolean"},
            "moe": {"type": "boolean"}}}},
        "target": {"type": "string"}, "build": BUILD, "llama_cpp_commit": STR_OR_NULL,
        "config": {"type": "object"},
        "summary": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        "results": {"type": "array", "items": {"type": "object", "required": ["status"],
                                               "properties": {"status": STATUS}}},
        "findings": {"type": "array", "items": {"$ref": "#/$defs/finding"}},
        "numerics": {"type": "array", "items": {"$ref": "#/$defs/finding"}},
        "timing": {"type": "object", "additionalProperties": {"type": "number"}},
        "control": {"type": "object", "description": "sweep: the full model fed its own token embeddings"},
        "policy": {"type": "object", "description": "determinism: what upstream promises per comparison class"},
        "same_schedule": {"type": "array"}, "pairs": {"type": "array"}, "chains": {"type": "array"},
        "rounding_control": {"type": ["object", "null"], "description": "determinism: how far one bf16 rounding of "
                             "the residual moves this model's logits (NMSE): kernel pairs are judged against it"},
        "schedule": {"type": "object", "description": "prefix-cache: the prompts and rounds sent"},
        "explored": {"type": "integer", "minimum": 0, "description": "radix: schedules run"},
        "flaky": {"type": "array", "description": "radix: findings that did not reproduce (not reported)",
                  "items": {"type": "object", "required": ["replay"], "properties": {"replay": RADIX_REPLAY}}},
        "again": {"type": "array", "items": RADIX_REPLAY, "description": "radix: later schedules with the findings "
                  "of one already found, counted, not replayed (a drawn surface goes on past a finding)"},
        "reuse_policy": {"type": "string", "description": "radix: the prompt-cache reuse it promises"}}}

LANE = {"type": "object", "required": ["row", "lane", "status", "detail", "seconds"], "properties": {
    "row": {"type": "string"}, "lane": {"type": "string"}, "status": STATUS, "detail": {"type": "string"},
    "seconds": {"type": "number", "minimum": 0}, "data": {"type": "object"},
    "bundles": {"type": "array", "items": {"type": "string"}, "description": "relative to the run directory"},
    "pictures": {"type": "array", "items": {"type": "string"}},
    "reports": {"type": "array", "items": {"$ref": "#/$defs/report"}}}}

RUN = {
    "type": "object", "description": "a family-certify run (run --out DIR: DIR/report.json; aggregate; mutants)",
    "required": ["schema", "kind", "command", "target", "build", "manifest", "plan", "results", "totals", "wall_s",
                 "exit_code"],
    "properties": {
        "schema": {"const": RUN_SCHEMA}, "kind": {"const": "family-certify-run"}, "command": {"type": "string"},
        "target": {"type": "string"}, "build": BUILD,
        "manifest": {"type": "object", "required": ["path", "sha256"], "properties": {
            "path": {"type": "string"}, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}},
        "plan": {"type": "array", "items": {"type": "object", "required": ["row", "lanes"], "properties": {
            "row": {"type": "string"}, "lanes": {"type": "array", "items": {"type": "string"}}}}},
        "results": {"type": "array", "items": LANE},
        "totals": {"type": "object", "propertyNames": STATUS, "additionalProperties": {"type": "integer"}},
        "wall_s": {"type": "number", "minimum": 0}, "exit_code": {"enum": [0, 1]},
        "picture": {"type": "string", "description": "the rows x lanes picture, relative to the run directory"}}}

BOUNDARY = {"type": "string", "pattern": "^[ASRBM][|][ASRBM]$", "description": "where a cut falls: the last layer "
            "of one stage | the first of the next (A attention, S sliding-window attention, R recurrent, B both, M "
            "feed-forward only)"}
CERT_ROW = {"type": "object", "additionalProperties": False,
            "required": ["recipe", "kinds", "status", "lanes", "boundaries", "wire", "state", "known"], "properties": {
    "recipe": {"type": "object", "required": ["family"], "description": "the manifest row's recipe: admit makes "
               "the fixture at a model's depth from it, to compare layer patterns"},
    "kinds": {"type": "string", "pattern": "^[ASRBM]*$", "description": "the fixture's layers, one letter each"},
    "status": {"enum": ["certified", "refused"]},
    "refused_because": {"type": "string", "description": "why the row is refused: a lane that failed without "
                        "naming a cut, or no cut certified"},
    "lanes": {"type": "object", "additionalProperties": STATUS},
    "boundaries": {"type": "object", "required": ["certified", "refused"], "properties": {
        "certified": {"type": "object", "propertyNames": BOUNDARY, "description": "boundary → the lanes that passed "
                      "a cut there", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        "refused": {"type": "object", "propertyNames": BOUNDARY, "description": "boundary → the first failing "
                    "lane result that cut there", "additionalProperties": {"type": "string"}}}},
    "wire": {"type": "object", "required": ["granted", "measured"], "properties": {
        "granted": {"type": "array", "items": {"const": "f16"}, "description": "gated: f16, when its lane passed"},
        "measured": {"type": "object", "additionalProperties": STATUS, "description": "measured, not granted"}}},
    "state": {"type": "array", "items": {"enum": ["kv", "recurrent", "indexer"]},
              "description": "what crosses a cut: attention KV, recurrent state, DSA indexer keys"},
    "known": {"type": "array", "items": {"type": "string"}, "description": "known upstream findings (repro paths) "
              "the row's lanes reproduce"},
    "fixture_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "the synthetic fixture the "
                       "lanes ran (synth make --row ROW writes the same bytes)"},
    "planner": {"type": "array", "description": "run --cuts planner:CMD: what the runtime's planner chose per stage "
                "count, and which of its sets were refused", "items": {
                    "type": "object", "required": ["stages", "chose", "refused"], "properties": {
                        "stages": {"type": "integer", "minimum": 2}, "chose": {"type": "array", "items": CUTS},
                        "refused": {"type": "array", "items": CUTS}}}}}}

CERTIFICATE = {
    "type": "object", "description": "what a split runtime may admit (run --out DIR: DIR/certificate.json, written "
    "only when every planned lane ran)",
    "required": ["schema", "kind", "command", "target", "build", "manifest", "architectures", "refused_families"],
    "properties": {
        "schema": {"const": 1}, "kind": {"const": "family-certify-certificate"}, "command": {"type": "string"},
        "target": {"type": "string"}, "build": BUILD, "manifest": RUN["properties"]["manifest"],
        "architectures": {"type": "object", "description": "GGUF general.architecture → its rows",
                          "additionalProperties": {"type": "object", "required": ["rows"], "properties": {
                              "rows": {"type": "object", "additionalProperties": CERT_ROW}}}},
        "refused_families": {"type": "array", "items": {"type": "object", "required": ["row", "arch", "why"],
                                                        "properties": {"row": {"type": "string"},
                                                                       "arch": {"type": "string"},
                                                                       "why": {"type": "string"}}}}}}

BUNDLE = {
    "type": "object", "description": "a repro bundle's bundle.json (replay: fuzz replay DIR)",
    "required": ["schema", "oracle", "target", "cuts", "config", "fingerprint", "fixture", "fixture_sha256", "spec",
                 "build", "llama_cpp_commit", "original", "shrink", "replay"],
    "properties": {
        "schema": {"const": BUNDLE_SCHEMA}, "oracle": ORACLE, "target": {"type": "string"}, "cuts": CUTS,
        "config": {"type": "object", "description": "the oracle's case config (its Oracle.case_fields)"},
        "fingerprint": FINGERPRINT, "fixture": {"type": "string"},
        "fixture_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "spec": {**OBJ_OR_NULL, "description": "the synthetic fixture's spec (null for a user's GGUF)"},
        "build": BUILD, "llama_cpp_commit": STR_OR_NULL,
        "original": {"type": "object", "required": ["fixture", "fixture_sha256", "cuts", "config"]},
        "shrink": {"type": "object", "required": ["runs", "steps"], "properties": {
            "runs": {"type": "integer", "minimum": 0}, "steps": {"type": "array", "items": {"type": "string"}}}},
        "replay": {"type": "string"}}}


VERDICT = {"enum": ["unchanged", "broke", "fixed", "drifted", "newly unsupported", "missing"]}
BUMP = {
    "type": "object", "description": "family-certify bump (--out DIR: DIR/report.json; aggregate of bump shards)",
    "required": ["schema", "kind", "command", "manifest", "base", "candidate", "policy", "results", "totals",
                 "build_s", "wall_s", "exit_code"],
    "properties": {
        "schema": {"const": 1}, "kind": {"const": "family-certify-bump"}, "command": {"type": "string"},
        "manifest": RUN["properties"]["manifest"], "base": BUILD, "candidate": BUILD,
        "policy": {"type": "string", "description": "what is promised across builds (the cross-build lane)"},
        "results": {"type": "array", "items": {
            "type": "object", "required": ["row", "lane", "verdict", "base", "candidate", "detail"],
            "properties": {
                "row": {"type": "string"}, "lane": {"type": "string"}, "verdict": VERDICT,
                "base": {"oneOf": [STATUS, {"type": "null"}], "description": "the lane's status on the base build "
                         "(null for the cross-build lane)"},
                "candidate": {"oneOf": [STATUS, {"type": "null"}]}, "detail": {"type": "string"},
                "bundles": {"type": "array", "items": {"type": "string"},
                            "description": "relative to DIR/candidate"},
                "max_abs_dlogit": {"type": "number"}, "nmse": {"type": "number"}, "bit_exact": {"type": "boolean"},
                "states": {"type": "object", "description": "cross-build: sequence state exported by one build, "
                           "imported by the other (crosses | crosses (numerics) | refused | wrong | unrun), with "
                           "the KV cells the exporter's state carries (a candidate's carrying more than the base's "
                           "breaks the row)"},
                "mixed_chains": {"type": "object", "description": "cross-build: stage 0 on one build, stage 1 on "
                                 "the other"}}}},
        "totals": {"type": "object", "propertyNames": VERDICT, "additionalProperties": {"type": "integer"}},
        "build_s": {"type": "object", "additionalProperties": {"type": "number"},
                    "description": "seconds each build took (0: from the cache)"},
        "wall_s": {"type": "number", "minimum": 0}, "exit_code": {"enum": [0, 1]}}}


COUNTS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
CAMPAIGN = {
    "type": "object", "description": "a fuzz campaign's state (DIR/campaign.json; campaign-merge writes one too)",
    "required": ["schema", "params", "next_case", "cases", "refused", "seconds", "runs", "specs", "statuses",
                 "findings"],
    "properties": {
        "schema": {"const": 1},
        "params": {"type": "object", "required": ["families", "oracles", "target", "seed", "shard"], "properties": {
            "families": {"type": "array", "items": {"type": "string"}},
            "oracles": {"type": "array", "items": ORACLE}, "target": {"type": "string"},
            "seed": {"type": "integer", "minimum": 0},
            "shard": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}}},
        "next_case": {"type": "integer", "minimum": 0}, "cases": {"type": "integer", "minimum": 0},
        "refused": {"type": "integer", "minimum": 0}, "seconds": {"type": "number", "minimum": 0},
        "case_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True},
        "runs": COUNTS, "specs": COUNTS, "statuses": {**COUNTS, "propertyNames": STATUS},
        "known": {**COUNTS, "description": "committed upstream repros (corpora/repros) seen again"},
        "numerics": {**COUNTS, "description": "differences an oracle's cause analysis explained, by 'oracle cause'"},
        "findings": {"type": "array", "items": {"type": "object", "required": ["key", "case", "message", "bundle"],
                                                "properties": {"key": {"type": "object", "required": ["family"]},
                                                               "case": {"type": "integer"},
                                                               "message": {"type": "string"},
                                                               "bundle": {"type": "string"}}}},
        "flaky": {"type": "array", "description": "reported by an oracle, not reproduced again: not findings"},
        "shards": {"type": "array", "items": {"type": "string"}}}}


CHECK = {"type": "object", "required": ["exit_code", "shows", "line"], "properties": {
    "exit_code": {"type": ["integer", "null"], "description": "the direct check's exit code (-1: no answer in "
                  "time; null: the entry has none yet)"},
    "shows": {"type": "boolean", "description": "exit 1: the check found the bug"},
    "line": {"type": "string", "description": "its last output line"}}}
CORPUS = {
    "type": "object", "description": "family-certify corpus (--out DIR: DIR/report.json): the upstream bug corpus "
    "through the per-bump gate",
    "required": ["schema", "kind", "command", "gate", "pinned", "entries", "totals", "caught_share", "goal", "wall_s",
                 "exit_code"],
    "properties": {
        "schema": {"const": 1}, "kind": {"const": "family-certify-corpus"}, "command": {"type": "string"},
        "gate": {"type": "object", "required": ["tier", "rows", "partial", "description"], "properties": {
            "tier": {"type": "integer"}, "rows": {"type": "array", "items": {"type": "string"}},
            "partial": {"type": "boolean", "description": "only some rows (--row): not the gate as shipped"},
            "jobs": {"type": "array", "items": {"type": "string"},
                     "description": "the CI jobs whose lanes ran ([jobs] in the manifest): gate, memory and "
                                    "server per bump"},
            "description": {"type": "string"}}},
        "pinned": {"type": "object", "required": ["passes", "failing", "totals"], "properties": {
            "passes": {"type": "boolean", "description": "the pinned build passes the same gate"},
            "failing": {"type": "array", "items": {"type": "string"}}, "totals": COUNTS}},
        "entries": {"type": "array", "items": {
            "type": "object", "required": ["entry", "upstream", "title", "class", "threads", "row", "caught", "by",
                                           "verdicts", "check", "build_s", "seconds"],
            "properties": {
                "entry": {"type": "string", "description": "corpora/upstream/<entry>"},
                "upstream": {"type": "integer"}, "title": {"type": "string"},
                "class": {"enum": list(CORPUS_CLASSES)},
                "threads": {"type": "array", "items": {"type": "string", "format": "uri"}, "minItems": 1},
                "row": {"type": "string", "description": "the manifest row whose fixture shows it"},
                "caught": {"type": "boolean"},
                "by": {"type": "array", "items": {"type": "string"}, "description": "row/lane the gate failed"},
                "verdicts": {"type": "object", "propertyNames": VERDICT, "additionalProperties": {"type": "integer"}},
                "check": {**CHECK, "required": [*CHECK["required"], "on_pinned"],
                          "properties": {**CHECK["properties"], "on_pinned": CHECK}},
                "build_s": {"type": "number"}, "seconds": {"type": "number"}}}},
        "totals": {"type": "object", "required": ["entries", "caught", "escaped", "classes"],
                   "additionalProperties": {"type": "integer", "minimum": 0}},
        "caught_share": {"type": "number", "minimum": 0, "maximum": 1}, "goal": {"type": "number"},
        "wall_s": {"type": "number", "minimum": 0}, "exit_code": {"enum": [0, 1]}}}

PAIR = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2,
        "description": "[covered, total]"}
COVERAGE = {
    "type": "object", "required": ["schema", "kind", "command", "build", "lanes", "files", "groups", "functions",
                                   "wall_s"],
    "properties": {
        "schema": {"const": COVERAGE_SCHEMA}, "kind": {"const": "family-certify-coverage"},
        "command": {"type": "string"},
        "build": {"type": "object", "description": "the coverage build's identity (its key, tree, options)"},
        "lanes": {"type": "array", "description": "each row × lane that ran, with its verdict", "items": {
            "type": "object", "required": ["row", "lane", "status", "detail", "seconds"],
            "properties": {"row": {"type": "string"}, "lane": {"type": "string"}, "status": STATUS,
                           "detail": {"type": "string"}, "seconds": {"type": "number"}}}},
        "files": {"type": "array", "items": {
            "type": "object", "required": ["file", "lines", "line_percent", "branches", "branch_percent", "functions"],
            "properties": {"file": {"type": "string", "description": "relative to the llama.cpp tree"},
                           "lines": PAIR, "line_percent": {"type": "number"}, "branches": PAIR,
                           "branch_percent": {"type": "number"}, "functions": PAIR}}},
        "groups": {"type": "array", "items": {
            "type": "object", "required": ["name", "title", "lines", "line_percent", "functions", "unaccounted"],
            "properties": {"name": {"type": "string"}, "title": {"type": "string"}, "lines": PAIR,
                           "line_percent": {"type": "number"}, "functions": PAIR,
                           "unaccounted": {"type": "integer", "minimum": 0, "description": "functions of the group "
                                           "no lane ran and no entry of corpora/coverage.toml accounts for"}}}},
        "functions": {"type": "array", "items": {
            "type": "object", "required": ["file", "function", "line", "calls", "lines", "first_lane", "groups",
                                           "ran", "account"],
            "properties": {"file": {"type": "string"}, "function": {"type": "string", "description": "demangled"},
                           "line": {"type": "integer"}, "calls": {"type": "integer", "minimum": 0}, "lines": PAIR,
                           "first_lane": {**STR_OR_NULL, "description": "the first lane (in run order) that ran it"},
                           "groups": {"type": "array", "items": {"type": "string"}},
                           "ran": {"type": "boolean", "description": "called, or a line of it run (a template: "
                                                                     "by any instantiation)"},
                           "account": {"type": ["object", "null"], "required": ["status", "why"],
                                       "description": "a group's function no lane ran: its entry in "
                                                      "corpora/coverage.toml (null: unaccounted, or it ran)",
                                       "properties": {"status": {"enum": ["unreachable", "todo"]},
                                                      "why": {"type": "string"}}}}}},
        "wall_s": {"type": "number", "minimum": 0}}}

MUTATE = {
    "type": "object", "required": ["schema", "kind", "command", "coverage", "build", "seed", "sample", "generated",
                                   "results", "wall_s", "complete"],
    "properties": {
        "schema": {"const": MUTATE_SCHEMA}, "kind": {"const": "family-certify-mutate"},
        "command": {"type": "string"}, "coverage": {"type": "string", "description": "the coverage run it drew from"},
        "build": {"type": "object", "description": "the coverage build's identity"},
        "seed": {"type": "integer"},
        "sample": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                   "description": "mutants drawn per group"},
        "generated": {"type": "integer", "minimum": 0, "description": "mutants of covered, non-arid lines in all"},
        "results": {"type": "array", "items": {
            "type": "object", "required": ["id", "group", "file", "line", "original", "mutated", "rule", "status",
                                           "by", "detail", "ran", "seconds"],
            "properties": {
                "id": {"type": "string"}, "group": {"type": "string"}, "file": {"type": "string"},
                "line": {"type": "integer", "minimum": 1}, "original": {"type": "string"},
                "mutated": {"type": "string"}, "rule": {"type": "string", "description": "the universalmutator rule"},
                "status": {"enum": list(MUTANT_STATUSES)},
                "by": {**STR_OR_NULL, "description": "row/lane that killed it"},
                "detail": {"type": "string"}, "ran": {"type": "array", "items": {"type": "string"}},
                "seconds": {"type": "number", "minimum": 0},
                "bundles": {"type": "array", "items": {"type": "string"},
                            "description": "--bundles: the killing finding's repro bundles (relative to the run)"}}}},
        "wall_s": {"type": "number", "minimum": 0},
        "complete": {"type": "boolean", "description": "every drawn mutant ran (false: the budget stopped it)"},
        "diff": {"type": "object", "required": ["base", "changed", "ran", "unrun"],
                 "description": "--diff: only the lines the build changes against base were mutated",
                 "properties": {
                     "base": {"type": "string", "description": "the base build spec"},
                     "changed": {"type": "integer", "minimum": 0,
                                 "description": "changed code lines of the groups' functions (arid ones left out)"},
                     "ran": {"type": "integer", "minimum": 0, "description": "of those, lines a lane ran"},
                     "unrun": {"type": "object", "additionalProperties": {"type": "string"},
                               "description": "file → the changed lines no lane ran, as ranges (3-9,12)"}}}}}


def schemas() -> dict[str, dict[str, Any]]:
    """file name → schema, each self-contained."""
    def doc(name: str, title: str, body: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
        return {"$schema": DRAFT, "$id": f"urn:family-certify:schema:{name}", "title": title, **body, "$defs": defs}

    return {
        "report.schema.json": doc("report", f"family-certify oracle report, schema {REPORT_SCHEMA}", REPORT,
                                  {"finding": FINDING}),
        "certify-run.schema.json": doc("certify-run", f"family-certify run, schema {RUN_SCHEMA}", RUN,
                                       {"report": REPORT, "finding": FINDING}),
        "bundle.schema.json": doc("bundle", f"family-certify repro bundle, schema {BUNDLE_SCHEMA}", BUNDLE, {}),
        "bump.schema.json": doc("bump", "family-certify bump, schema 1", BUMP, {}),
        "campaign.schema.json": doc("campaign", "family-certify fuzz campaign state, schema 1", CAMPAIGN, {}),
        "corpus.schema.json": doc("corpus", "family-certify corpus, schema 1", CORPUS, {}),
        "certificate.schema.json": doc("certificate", "family-certify certificate, schema 1", CERTIFICATE, {}),
        "coverage.schema.json": doc("coverage", f"family-certify coverage, schema {COVERAGE_SCHEMA}", COVERAGE, {}),
        "mutate.schema.json": doc("mutate", f"family-certify mutate, schema {MUTATE_SCHEMA}", MUTATE, {}),
    }


def write(out: Path = DIR) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in schemas().items():
        (out / name).write_text(json.dumps(schema, indent=2) + "\n")
        paths.append(out / name)
    return paths


def validate(data: Any, name: str) -> None:
    """Raise jsonschema.ValidationError unless data satisfies schemas/NAME (report, certify-run, bundle, bump,
    campaign, corpus, certificate, coverage or mutate)."""
    import jsonschema

    schema = json.loads((DIR / f"{name}.schema.json").read_text())
    jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DIR):
        print(p)
