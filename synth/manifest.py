"""family_tiers.toml: the one manifest of certified families.

Parsing and validation only (synth does not run lanes): every problem is a UserError naming the file, the row
and the fix. A row's fixture recipe resolves through the family registry like `synth make` knobs do.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth.dtype import DTYPES
from synth.errors import UserError, read_text
from synth.families import FAMILIES, Family, get_family
from synth.spec import KNOBS, Knobs, ModelSpec

MANIFEST_NAME = "family_tiers.toml"
SCHEMA = 1
TIERS = (1, 2, 3)
LANES = ("load", "parity", "boundary-sweep", "fixed-split", "dtype", "wire", "isolation", "memory", "shift",
         "handoff", "determinism", "prefix-cache", "prompt-trees", "reject")
ROW_KEYS = {"tier", "name", "arch", "artifact", "size", "why", "seed_row", "recipe", "sweep_period", "lanes",
            "dtypes", "wires", "expect", "known", "runnable", "reason"}
REQUIRED_ROW_KEYS = ("tier", "name", "arch", "artifact", "size", "why")
TIER_KEYS = {"description", "lanes", "dtypes", "wires", "expect"}
WIRES = ("f32", "f16", "bf16", "q8_0")  # the wire lane's types: what hidden states cross a boundary as
# the TOML type of every key (lanes and dtypes are checked element by element where they are read)
KEY_TYPES: dict[str, type | tuple[type, ...]] = {
    "tier": int, "name": str, "arch": str, "artifact": str, "size": str, "why": str, "seed_row": str, "recipe": dict,
    "sweep_period": int, "lanes": list, "dtypes": list, "wires": list, "expect": dict, "known": dict, "runnable": bool,
    "reason": str, "description": str}
# the lanes `family-certify scan` runs on every row (every oracle at every cut): a row's `known` may name them
SCAN_LANES = ("parity", "dtype-all", "wire-all", "handoff-all", "isolation", "memory", "shift", "determinism-full",
              "determinism-chains")
RECIPE_KNOBS = {k.name for k in KNOBS} | {"seed"}  # synth.spec.KNOBS: the one knob table


@dataclass
class Tier:
    number: int
    description: str
    lanes: list[str]
    expect: dict[str, str]
    dtypes: list[str] = field(default_factory=list)  # the dtype lane's weight types
    wires: list[str] = field(default_factory=list)  # the wire lane's types


def recipe_knobs(recipe: dict[str, Any]) -> Knobs:
    """A row's recipe (family and knobs, as the manifest writes them) as synth's Knobs."""
    k = {key: v for key, v in recipe.items() if key != "family"}
    if "kv_heads" in k:
        k["kv_heads"] = tuple(k["kv_heads"]) if isinstance(k["kv_heads"], (list, tuple)) else (k["kv_heads"],)
    return Knobs(**k)


@dataclass
class Row:
    key: str
    tier: int
    name: str
    arch: str
    artifact: str
    size: str
    why: str
    recipe: dict[str, Any]
    seed_row: str | None = None
    sweep_period: int | None = None
    lanes: list[str] = field(default_factory=list)  # effective lanes (tier defaults unless overridden)
    dtypes: list[str] = field(default_factory=list)  # the dtype lane's weight types (tier default unless set)
    wires: list[str] = field(default_factory=list)  # the wire lane's types (tier default unless set)
    expect: dict[str, str] = field(default_factory=dict)
    known: dict[str, str] = field(default_factory=dict)  # lane → a known upstream finding it reproduces (repro path)
    runnable: bool = True
    reason: str | None = None

    @property
    def family(self) -> Family | None:
        return FAMILIES.get(str(self.recipe.get("family", "")))

    def knobs(self) -> Knobs:
        return recipe_knobs(self.recipe)

    def artifact_dtypes(self) -> list[str]:
        """The weight types the row's artifact name gives ("Llama-3.2-1B Q4_K_M" → q4_k, "IQ2_XXS" → iq2_xxs): the
        scan quantizes a fixture as the row's artifact is quantized when the row has no dtypes of its own."""
        model = re.sub(r"MMPROJ\s+\S+", "", self.artifact.upper())  # (a projector's type is not the model's)
        words = re.findall(r"(?<![A-Z0-9])(I?Q\d_[A-Z0-9]+|Q8|MXFP4|BF16|F16)", model)  # Q4_K_M → Q4_K
        found = [{"Q8": "q8_0"}.get(w, w.lower()) for w in words]
        return [d for i, d in enumerate(found) if d in DTYPES and d not in found[:i]]

    def spec(self) -> ModelSpec:
        return get_family(str(self.recipe["family"])).resolve(self.knobs())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.key, "title": self.name, "tier": self.tier, "arch": self.arch,
                "family": self.recipe.get("family"), "runnable": self.runnable, "reason": self.reason,
                "artifact": self.artifact, "size": self.size, "why": self.why, "seed_row": self.seed_row,
                "recipe": self.recipe, "sweep_period": self.sweep_period, "lanes": self.lanes, "dtypes": self.dtypes,
                "wires": self.wires, "expect": self.expect, "known": self.known}


@dataclass
class Manifest:
    path: Path
    tiers: dict[int, Tier]
    rows: dict[str, Row]
    not_split_served: dict[str, str] = field(default_factory=dict)  # architecture → why no row certifies it
    jobs: dict[str, list[str]] = field(default_factory=dict)  # CI job → the lanes it runs ([jobs]; every lane once)

    def job_lanes(self, jobs: list[str] | None) -> set[str] | None:
        """The lanes the named jobs run (None: no job named, every lane)."""
        if not jobs:
            return None
        unknown = [j for j in jobs if j not in self.jobs]
        if unknown:
            have = ", ".join(self.jobs) or "none: the manifest has no [jobs] table"
            raise UserError(f"--job {unknown[0]!r}: {self.path}'s jobs are {have}")
        return {lane for j in jobs for lane in self.jobs[j]}

    @property
    def row_archs(self) -> set[str]:
        """The architectures the rows name."""
        return {r.arch for r in self.rows.values()}

    def unclassified(self, archs: list[str]) -> list[str]:
        """The architectures (of a llama.cpp tree's list) that no row names and [not_split_served] does not list."""
        named = self.row_archs | set(self.not_split_served)
        return [a for a in archs if a not in named]

    def row(self, key: str) -> Row:
        if key not in self.rows:
            near = [k for k in self.rows if key.lower() in k.lower()]
            hint = f"; did you mean {', '.join(near[:3])}?" if near else "; `family-certify check` lists the rows"
            raise UserError(f"{self.path}: no row {key!r}{hint}")
        return self.rows[key]

    def select(self, tier: int | None = None, names: list[str] | None = None) -> list[Row]:
        rows = [self.row(n) for n in names] if names else list(self.rows.values())
        return [r for r in rows if tier is None or r.tier == tier]


def default_manifest_path() -> Path:
    """./family_tiers.toml if present, else the one in this checkout."""
    here = Path.cwd() / MANIFEST_NAME
    return here if here.is_file() else Path(__file__).resolve().parent.parent / MANIFEST_NAME


def load_manifest(path: str | os.PathLike | None = None) -> Manifest:
    p = Path(path) if path else default_manifest_path()
    if not p.is_file():
        raise UserError(f"{p}: no such manifest; pass the path of a {MANIFEST_NAME}")
    text = read_text(p, "manifest", f"pass a {MANIFEST_NAME}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        if "Cannot declare" in msg or "Cannot overwrite a value" in msg:
            line = re.search(r"line (\d+)", msg)
            where = f" (line {line.group(1)})" if line else ""
            raise UserError(f"{p}: duplicate family table{where}: {msg}; each [family.NAME] may appear once") \
                from None
        raise UserError(f"{p}: not valid TOML: {msg}") from None
    return parse_manifest(data, p)


def parse_manifest(data: dict[str, Any], p: Path) -> Manifest:
    unknown = set(data) - {"schema", "tiers", "family", "not_split_served", "jobs"}
    if unknown:
        raise UserError(f"{p}: unknown top-level key {sorted(unknown)[0]!r}; allowed: schema, tiers, family, "
                        "not_split_served, jobs")
    if data.get("schema") != SCHEMA:
        raise UserError(f"{p}: schema = {data.get('schema')!r}; this family-certify reads schema = {SCHEMA}")
    tiers: dict[int, Tier] = {}
    for key, t in (data.get("tiers") or {}).items():
        if not str(key).isdigit() or int(key) not in TIERS:
            raise UserError(f"{p}: [tiers.{key}]: tier out of range; tiers are {', '.join(map(str, TIERS))}")
        if not isinstance(t, dict):
            raise UserError(f"{p}: [tiers.{key}] must be a table")
        bad = set(t) - TIER_KEYS
        if bad:
            raise UserError(f"{p}: [tiers.{key}]: unknown key {sorted(bad)[0]!r}; "
                            f"allowed: {', '.join(sorted(TIER_KEYS))}")
        _check_types(t, f"{p}: [tiers.{key}]")
        lanes = _lanes(t.get("lanes", []), p, f"[tiers.{key}]")
        tiers[int(key)] = Tier(int(key), str(t.get("description", "")), lanes, dict(t.get("expect", {})),
                               _dtypes(t.get("dtypes", []), f"{p}: [tiers.{key}]"),
                               _wires(t.get("wires", []), f"{p}: [tiers.{key}]"))
    missing = [t for t in TIERS if t not in tiers]
    if missing:
        raise UserError(f"{p}: no [tiers.{missing[0]}] table; every tier needs its default lanes and expectations")

    rows: dict[str, Row] = {}
    families = data.get("family") or {}
    if not families:
        raise UserError(f"{p}: no [family.NAME] tables")
    for key, r in families.items():
        where = f"{p}: [family.{key}]"
        if not isinstance(r, dict):
            raise UserError(f"{where}: must be a table")
        bad = set(r) - ROW_KEYS
        if bad:
            raise UserError(f"{where}: unknown key {sorted(bad)[0]!r}; allowed: {', '.join(sorted(ROW_KEYS))}")
        for req in REQUIRED_ROW_KEYS:
            if req not in r:
                raise UserError(f"{where}: missing {req!r}")
        _check_types(r, where)
        tier = r["tier"]
        if not isinstance(tier, int) or tier not in TIERS:
            raise UserError(f"{where}: tier = {tier!r} is out of range; use 1, 2 or 3")
        recipe = dict(r.get("recipe", {}))
        runnable = bool(r.get("runnable", True))
        reason = r.get("reason")
        if not runnable and not reason:
            raise UserError(f"{where}: runnable = false needs a reason (from llama.cpp's own code or tests)")
        if runnable:
            _check_recipe(recipe, r["arch"], where)
        row = Row(key=key, tier=tier, name=str(r["name"]), arch=str(r["arch"]), artifact=str(r["artifact"]),
                  size=str(r["size"]), why=str(r["why"]), recipe=recipe, seed_row=r.get("seed_row"),
                  sweep_period=r.get("sweep_period"),
                  lanes=_lanes(r["lanes"], p, where) if "lanes" in r else list(tiers[tier].lanes),
                  dtypes=_dtypes(r["dtypes"], where) if "dtypes" in r else list(tiers[tier].dtypes),
                  wires=_wires(r["wires"], where) if "wires" in r else list(tiers[tier].wires),
                  expect={**tiers[tier].expect, **dict(r.get("expect", {}))}, known=dict(r.get("known", {})),
                  runnable=runnable, reason=reason)
        if "lanes" not in r and not _interleaved(row):
            row.lanes = [x for x in row.lanes if x != "boundary-sweep"]  # the tier's sweep is for hybrids
        for lane, what in row.known.items():
            if lane not in (*row.lanes, *SCAN_LANES) or not isinstance(what, str) or not what:
                raise UserError(f"{where}: known.{lane}: name a lane of this row (or of `family-certify scan`: "
                                f"{', '.join(SCAN_LANES)}) and describe the finding (with its repro), e.g. "
                                "known = {{ isolation = \"...; corpora/repros/...\" }}")
        rows[key] = row
    outside = data.get("not_split_served") or {}
    if not isinstance(outside, dict) or any(not isinstance(v, str) or not v for v in outside.values()):
        raise UserError(f"{p}: [not_split_served]: one line per architecture, ARCH = \"why no row certifies it\"")
    both = sorted(set(outside) & {r.arch for r in rows.values()})
    if both:
        raise UserError(f"{p}: [not_split_served]: {both[0]!r} is also a row's arch; keep it in one place")
    return Manifest(p, tiers, rows, dict(outside), _jobs(data.get("jobs"), p))


def _jobs(jobs: Any, p: Path) -> dict[str, list[str]]:
    """[jobs]: JOB = [lanes]; every lane in exactly one job, so the jobs together run what the tiers plan."""
    if jobs is None:
        return {}
    if not isinstance(jobs, dict) or not jobs:
        raise UserError(f"{p}: [jobs]: one line per CI job, JOB = [\"lane\", ...]")
    seen: dict[str, str] = {}
    for job, lanes in jobs.items():
        for lane in _lanes(lanes, p, f"[jobs] {job}"):
            if lane in seen:
                raise UserError(f"{p}: [jobs]: lane {lane!r} is in {seen[lane]!r} and {job!r}; a lane runs in one job")
            seen[lane] = job
    left = [lane for lane in LANES if lane not in seen]
    if left:
        raise UserError(f"{p}: [jobs]: lane {left[0]!r} is in no job; add it to one (gate, memory, server, nightly)")
    return {str(job): [str(x) for x in lanes] for job, lanes in jobs.items()}


def _check_types(table: dict[str, Any], where: str) -> None:
    for k, v in table.items():
        want = KEY_TYPES.get(k)
        if want is not None and (not isinstance(v, want) or (want is int and isinstance(v, bool))):
            raise UserError(f"{where}: {k} = {v!r} must be {_TOML_NAMES[want]}")


_TOML_NAMES = {int: "an integer", str: "a string", dict: "an inline table { ... }", list: "an array [ ... ]",
               bool: "true or false"}


def _interleaved(row: Row) -> bool:
    """A row whose layers interleave kinds (hybrids), or that names a sweep period (e.g. SWA patterns)."""
    fam = row.family
    return bool(row.sweep_period) or (fam is not None and fam.kind == "hybrid" and not fam.parallel_hybrid)


def _wires(wires: Any, where: str) -> list[str]:
    if not isinstance(wires, list) or any(w not in WIRES for w in wires):
        raise UserError(f"{where}: wires must be a list of {', '.join(WIRES)}, e.g. [\"f16\", \"q8_0\"]")
    return [str(w) for w in wires]


def _dtypes(dtypes: Any, where: str) -> list[str]:
    if not isinstance(dtypes, list) or any(d not in DTYPES for d in dtypes):
        raise UserError(f"{where}: dtypes must be a list of {', '.join(DTYPES)}, e.g. [\"q8_0\", \"q4_0\"]")
    return [str(d) for d in dtypes]


def _lanes(lanes: Any, p: Path, where: str) -> list[str]:
    if not isinstance(lanes, list):
        raise UserError(f"{where}: lanes must be a list, e.g. [\"load\", \"parity\"]")
    for lane in lanes:
        if lane not in LANES:
            raise UserError(f"{where}: unknown lane {lane!r}; lanes are {', '.join(LANES)}")
    return [str(x) for x in lanes]


def _check_recipe(recipe: dict[str, Any], arch: str, where: str) -> None:
    fam_name = recipe.get("family")
    if not fam_name or not isinstance(fam_name, str):
        raise UserError(f"{where}: recipe needs a family (one of `synth list`), e.g. recipe = {{ family = \"qwen3\" }}")
    if fam_name not in FAMILIES:
        raise UserError(f"{where}: unknown family {fam_name!r} in recipe; `synth list` shows the families "
                        "(or mark the row runnable = false with the reason)")
    bad = set(recipe) - RECIPE_KNOBS - {"family"}
    if bad:
        raise UserError(f"{where}: unknown recipe knob {sorted(bad)[0]!r}; knobs are {', '.join(sorted(RECIPE_KNOBS))}")
    fam = FAMILIES[fam_name]
    if fam.arch_name != arch:
        raise UserError(f"{where}: arch = {arch!r} but recipe family {fam_name!r} writes arch {fam.arch_name!r}")
    try:
        Row(key="", tier=1, name="", arch=arch, artifact="", size="", why="", recipe=recipe).spec()
    except UserError as e:
        raise UserError(f"{where}: recipe: {e}") from None
    except TypeError as e:
        raise UserError(f"{where}: recipe: {e}") from None
