"""The documentation: the README stays a short front door with the CI block on its first screen, every relative
link in the README, the CHANGELOG and docs/ resolves, docs/families.md is the manifest's, every upstream repro is
explained in docs/findings.md, and no tracked file points outside the repository. No llama.cpp process."""

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# places outside the repository a tracked file must not point to (written so this file does not match itself)
OUTSIDE = [re.compile(r"\.\./shared/"), re.compile(r"\.\./\.library"), re.compile(r"(?<![\w.~/-])/work(?=/)")]


def families_md():
    spec = importlib.util.spec_from_file_location("families_md", ROOT / "scripts" / "families_md.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_is_short():
    size = README.stat().st_size
    assert size <= 12 * 1024, f"README.md is {size} bytes; keep it a front door (reference goes to docs/)"


def test_the_readme_shows_the_ci_block_and_the_bump_on_its_first_screen():
    first = "\n".join(README.read_text().splitlines()[:60])
    assert "uses:" in first and "family-certify bump" in first


def test_the_readme_keeps_make_test():
    """CI and .ci/run run `make test`, the README's command (tests/test_workflows.py)."""
    assert "make test " in README.read_text()


def links(page: Path) -> list[str]:
    """The relative link targets of a markdown page, outside code blocks and code spans, without their #anchor."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return [t.split("#", 1)[0] for t in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = [t for t in links(page) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: no such file: {broken}"


def test_the_link_check_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](there.md#x) [b](https://example.org) [c](#top) `[d](no.md)`\n```\n[e](no.md)\n```\n")
    assert links(page) == ["there.md"]


def test_the_families_page_is_the_manifests():
    want = families_md().render(ROOT / "family_tiers.toml")
    assert (ROOT / "docs" / "families.md").read_text() == want, \
        "docs/families.md is not generated from family_tiers.toml; run .venv/bin/python scripts/families_md.py"


def test_every_upstream_repro_is_explained_in_findings():
    """A committed repro of an upstream finding (not a mutant's) is named in docs/findings.md as (`NAME`)."""
    findings = (ROOT / "docs" / "findings.md").read_text()
    upstream = [d.name for d in sorted((ROOT / "corpora" / "repros").iterdir()) if (d / "bundle.json").is_file()
                and not json.loads((d / "bundle.json").read_text())["target"].startswith("mutant:")]
    assert upstream
    assert not [n for n in upstream if f"(`{n}`)" not in findings]


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    out = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or name.endswith(".svg") or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (a GGUF, a picture)
            continue
        out.append(path)
    return out


def test_no_tracked_file_points_outside_the_repository():
    hits = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        hits += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                 for pattern in OUTSIDE for m in pattern.finditer(text)]
    assert not hits, hits


def test_the_outside_check_sees_what_it_must():
    # (the sample is put together, so that this file does not itself point outside)
    text = "see .." + "/shared/reference/x.md, .." + "/.library/y, /wo" + "rk/main/z; not /tmp/camp/work/case.gguf"
    assert [p.search(text) is not None for p in OUTSIDE] == [True, True, True]
    assert OUTSIDE[2].findall("/tmp/camp/work/case.gguf builds/work-1") == []
