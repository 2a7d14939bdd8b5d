"""docs/families.md, generated from family_tiers.toml: each tier's lanes and expectations, one table row per family
(its arch, tier, the synthetic fixture's recipe, the real artifact it stands for and why it is certified), the known
upstream findings rows carry, and the architectures no row certifies.

    .venv/bin/python scripts/families_md.py           # rewrite docs/families.md
    .venv/bin/python scripts/families_md.py --check   # exit 1 when the committed page is not the manifest's

tests/test_docs.py runs the same comparison, so a manifest change without the page regenerated fails the suite.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

from synth.manifest import Manifest, Row, load_manifest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "family_tiers.toml"
PAGE = ROOT / "docs" / "families.md"
COMMAND = ".venv/bin/python scripts/families_md.py"


def cell(text: Any) -> str:
    """A value as one markdown table cell: pipes escaped, newlines folded."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def para(text: str) -> str:
    """Prose wrapped as the other pages are (118 columns)."""
    return textwrap.fill(text, 118, break_long_words=False, break_on_hyphens=False)


def knob(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def recipe(row: Row) -> str:
    """The fixture as `synth make` arguments: the synth family, then its knobs."""
    if not row.runnable:
        return f"not runnable: {row.reason}"
    knobs = " ".join(f"--{k.replace('_', '-')} {knob(v)}" for k, v in row.recipe.items() if k != "family")
    return f"`{row.recipe.get('family')}` {knobs}".strip()


def lanes(row: Row, m: Manifest) -> str:
    """The row's lanes against its tier's: `tier` when the same, else what it adds and leaves out."""
    tier = m.tiers[row.tier].lanes
    added = [x for x in row.lanes if x not in tier]
    dropped = [x for x in tier if x not in row.lanes]
    if not added and not dropped:
        return "tier"
    return ", ".join([f"with {x}" for x in added] + [f"without {x}" for x in dropped])


def render(path: Path = MANIFEST) -> str:
    """The page's text for the manifest at `path`."""
    m = load_manifest(path)
    counts = ", ".join(f"tier {t}: {sum(r.tier == t for r in m.rows.values())}" for t in sorted(m.tiers))
    intro = (f"Every row of `{path.name}`: {len(m.rows)} families, {counts}. A row's lanes and per-target "
             "expectations come from its tier unless the row overrides them; moving a family between tiers is its "
             "`tier =` line. The fixture is what `synth make --row ROW` writes (a synth family and its knobs); the "
             "artifact is the real model the row stands for.")
    out = [f"<!-- Generated from {path.name} by scripts/families_md.py; do not edit. Regenerate: {COMMAND} -->",
           "", "# Families", "", para(intro), ""]
    for t in sorted(m.tiers):
        tier = m.tiers[t]
        out += [f"## Tier {t}", "", para(tier.description), "",
                "- lanes: " + ", ".join(f"`{x}`" for x in tier.lanes)]
        if tier.dtypes:
            out.append("- dtype lane's weight types: " + ", ".join(f"`{x}`" for x in tier.dtypes))
        if tier.wires:
            out.append("- wire lane's types: " + ", ".join(f"`{x}`" for x in tier.wires))
        out += ["- expected: " + "; ".join(f"{k}: {v}" for k, v in tier.expect.items()), ""]
        out += ["| row | family | arch | fixture | lanes | artifact | size | why |", "|---" * 8 + "|"]
        for r in m.rows.values():
            if r.tier == t:
                out.append(f"| {cell(r.key)} | {cell(r.name)} | `{cell(r.arch)}` | {cell(recipe(r))} | "
                           f"{cell(lanes(r, m))} | {cell(r.artifact)} | {cell(r.size)} | {cell(r.why)} |")
        out.append("")
    out += [para("Lanes: `tier` is the tier's list; otherwise what the row runs beyond it or without. A tier's "
                 "`boundary-sweep` runs only on rows whose layers interleave kinds (hybrids) or that set a "
                 "`sweep_period`."), ""]
    overrides = [r for r in m.rows.values() if r.expect != m.tiers[r.tier].expect]
    if overrides:
        out += ["## Per-row expectations", "", "| row | target | expected |", "|---|---|---|"]
        for r in overrides:
            for target, what in r.expect.items():
                if m.tiers[r.tier].expect.get(target) != what:
                    out.append(f"| {cell(r.key)} | {cell(target)} | {cell(what)} |")
        out.append("")
    known = [(r, lane, what) for r in m.rows.values() for lane, what in r.known.items()]
    if known:
        out += ["## Known upstream findings", "",
                para("A lane listed here reports `known` while it fails exactly this way on the pinned llama.cpp, and "
                     "fails once the finding is gone (the entry must then be removed). The findings are explained in "
                     "[findings.md](findings.md)."), "",
                "| row | lane | finding |", "|---|---|---|"]
        out += [f"| {cell(r.key)} | `{cell(lane)}` | {cell(what)} |" for r, lane, what in known]
        out.append("")
    if m.not_split_served:
        out += ["## Architectures no row certifies", "",
                para("`[not_split_served]`: every other architecture the pinned llama.cpp knows, with why no row "
                     "certifies it. An architecture in neither place fails `family-certify check --tree` and "
                     "`family-certify bump`."), "", "| arch | why |", "|---|---|"]
        out += [f"| `{cell(a)}` | {cell(why)} |" for a, why in m.not_split_served.items()]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when docs/families.md is not up to date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is not the manifest's; regenerate it: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
