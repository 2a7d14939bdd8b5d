"""fuzz.repro.pictures: the SVGs say what the report says (cells, marks, layer kinds, labels), byte for byte the same
each time. Reports are built by hand; no llama.cpp needed."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from fuzz.repro.pictures import (
    STATUS_COLOURS,
    battery_picture,
    handoff_grid,
    handoff_offsets,
    handoff_picture,
    report_picture,
    sweep_picture,
)

SVG = "{http://www.w3.org/2000/svg}"
KINDS = "RRRARRRARRRA"
NAMES = {"A": "attention", "R": "recurrent"}
CONFIG = {"prompt_len": 6, "tokens": 4, "decode_offsets": 2, "modes": ["full", "partial"], "chunk": 5}
OFFSETS = [1, 2, 3, 4, 5, 6, 7]  # prompt offsets 1..5, then 2 decode offsets


def layers(kinds: str = KINDS) -> list[dict[str, Any]]:
    return [{"kind": NAMES[c], "swa": i == 3, "moe": i % 4 == 1} for i, c in enumerate(kinds)]


def handoff_report(**over: Any) -> dict[str, Any]:
    results = [{"cuts": [], "stages": [[0, 12]], "status": "pass", "offsets": 7}]
    for c in (1, 2, 3, 4):
        results.append({"cuts": [c], "stages": [[0, c], [c, 12]], "status": "pass", "offsets": 7})
    results[3].update(status="finding", mode="full", offset=4, stage=1, offsets=4,
                      reason="full hand-off at t=4: stage 1 output differs from the uninterrupted run at position 4")
    results.append({"cuts": [2, 6], "stages": [[0, 2], [2, 6], [6, 12]], "status": "pass", "offsets": 7})
    rep = {"schema": 2, "oracle": "handoff", "fixture": "fx/jamba.gguf", "arch": "jamba", "n_layer": 12,
           "kinds": KINDS, "layers": layers(), "config": dict(CONFIG), "status": "finding", "results": results,
           "findings": [{"oracle": "handoff", "status": "finding", "message": "full hand-off at t=4", "cuts": [3],
                         "stage": 1, "offset": 4, "phase": "full"}]}
    rep.update(over)
    return rep


def sweep_report(**over: Any) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{"cuts": [c], "stages": [[0, c], [c, 12]], "status": "pass"} for c in range(1, 6)]
    results[2].update(status="finding", phase="decode", step=1, position=6, stage=1, layer=4,
                      reason="decode step 1: layer 4 differs")
    results[4].update(status="unsupported", reason="the input LayerNorm is applied to embedding input too " * 3)
    rep = {"schema": 2, "oracle": "sweep", "fixture": "fx/jamba.gguf", "arch": "jamba", "n_layer": 12,
           "kinds": KINDS, "layers": layers(), "config": {"phases": ["prefill", "decode", "batched"]},
           "status": "finding", "results": results, "control": {"status": "pass"}}
    rep.update(over)
    return rep


def parse(path: Path) -> ET.Element:
    return ET.parse(path).getroot()


def gids(root: ET.Element, prefix: str) -> list[str]:
    return [g.get("id", "") for g in root.iter(f"{SVG}g") if g.get("id", "").startswith(prefix)]


def texts(root: ET.Element) -> set[str]:
    return {"".join(t.itertext()).strip() for t in root.iter(f"{SVG}text")}


def cells(root: ET.Element, n_key: int) -> dict[tuple[str, ...], str]:
    """{key parts: status} of the grid cells; the status is the gid's last part."""
    out = {}
    for gid in gids(root, "cell:"):
        parts = gid.split(":")[1:]
        assert len(parts) == n_key + 1, gid
        out[tuple(parts[:-1])] = parts[-1]
    return out


@pytest.fixture(scope="module")
def handoff_svg(tmp_path_factory) -> Path:
    return handoff_picture(handoff_report(), tmp_path_factory.mktemp("pictures") / "handoff.svg")


def test_handoff_offsets_follow_the_oracle():
    assert handoff_offsets(CONFIG) == OFFSETS
    assert handoff_offsets({"prompt_len": 6, "tokens": 1, "decode_offsets": 2}) == [1, 2, 3, 4, 5, 6]
    assert handoff_offsets({}, [{"offsets": 3}, {"offsets": 1}]) == [1, 2, 3]


def test_handoff_cells_one_per_cut_set_offset_and_mode(handoff_svg):
    root = parse(handoff_svg)
    got = cells(root, 3)
    rows = ["none", "1", "2", "3", "4", "2,6"]
    assert len(got) == len(rows) * len(OFFSETS) * 2
    assert {k for k in got} == {(m, r, str(t)) for m in ("full", "partial") for r in rows for t in OFFSETS}
    assert all(s == "pass" for (m, r, t), s in got.items() if r != "3")


def test_handoff_marks_the_findings_cell_and_stops_there(handoff_svg):
    root = parse(handoff_svg)
    assert gids(root, "marked:") == ["marked:full:3:4"]
    got = cells(root, 3)
    assert [got[("full", "3", str(t))] for t in OFFSETS] == ["pass"] * 3 + ["finding"] + ["not-run"] * 3
    # the partial hand-off at t=4 comes after the full one, which already differed
    assert [got[("partial", "3", str(t))] for t in OFFSETS] == ["pass"] * 3 + ["not-run"] * 4


def test_handoff_partial_finding_after_a_passing_full_one(tmp_path):
    rep = handoff_report()
    rep["results"][2].update(status="diverged", mode="partial", offset=6, offsets=6)  # pre-schema-2 word
    root = parse(handoff_picture(rep, tmp_path / "h.svg"))
    got = cells(root, 3)
    assert sorted(gids(root, "marked:")) == ["marked:full:3:4", "marked:partial:2:6"]
    assert [got[("full", "2", str(t))] for t in OFFSETS] == ["pass"] * 6 + ["not-run"]
    assert [got[("partial", "2", str(t))] for t in OFFSETS] == ["pass"] * 5 + ["finding", "not-run"]


def test_handoff_bytes_finding_is_drawn_on_the_full_panel(tmp_path):
    rep = handoff_report()
    rep["results"][3].update(mode="bytes", offset=2, offsets=2, reason="the export holds no recurrent payload")
    root = parse(handoff_picture(rep, tmp_path / "h.svg"))
    assert gids(root, "marked:") == ["marked:full:3:2"]
    got = cells(root, 3)
    assert got[("full", "3", "2")] == "finding" and got[("partial", "3", "2")] == "not-run"


def test_handoff_location_from_the_findings_list(tmp_path):
    rep = handoff_report()
    for k in ("mode", "offset", "reason"):
        del rep["results"][3][k]  # only the finding says where: offset 4, "phase" full
    root = parse(handoff_picture(rep, tmp_path / "h.svg"))
    assert gids(root, "marked:") == ["marked:full:3:4"]
    assert "full hand-off at t=4" in texts(root)


def test_handoff_crash_without_a_mode_colours_the_offset_it_reached():
    rep = handoff_report()
    rep["results"][1].update(status="crash", offsets=2, reason="worker died")
    rep["results"][2].update(status="timeout", offsets=0, reason="load timed out")
    labels, offsets, modes, grid, marks = handoff_grid(rep)
    assert grid[("full", 1)] == grid[("partial", 1)] == ["pass", "crash"] + ["not-run"] * 5
    assert grid[("full", 2)] == ["timeout"] * 7  # it never reached an offset
    assert marks == [("full", 3, 3)]


def test_handoff_layer_strip_and_cuts(handoff_svg):
    root = parse(handoff_svg)
    strip = gids(root, "layer:")
    assert len(strip) == 12
    assert [g.split(":")[1] for g in strip] == [str(i) for i in range(12)]
    assert [g.split(":")[2] for g in strip] == [NAMES[c] for c in KINDS]
    assert (strip[0], strip[1], strip[3]) == ("layer:0:recurrent", "layer:1:recurrent:moe", "layer:3:attention:swa")
    assert sorted(gids(root, "cuts:")) == ["cuts:1", "cuts:2", "cuts:2,6", "cuts:3", "cuts:4"]  # none has no cut


def test_handoff_labels(handoff_svg):
    got = texts(parse(handoff_svg))
    assert {"none", "1", "2", "3", "4", "2,6"} <= got
    assert {str(t) for t in OFFSETS} <= got
    assert {"full hand-off at t", "partial hand-off at t", "pass", "finding", "not run"} <= got
    assert any("jamba.gguf" in t for t in got)


def test_same_input_same_bytes(tmp_path):
    a = handoff_picture(handoff_report(), tmp_path / "a.svg").read_bytes()
    b = handoff_picture(handoff_report(), tmp_path / "b.svg").read_bytes()
    assert a == b
    s1 = sweep_picture(sweep_report(), tmp_path / "s1.svg").read_bytes()
    s2 = sweep_picture(sweep_report(), tmp_path / "s2.svg").read_bytes()
    assert s1 == s2
    assert b"Date" not in a


def test_unsupported_handoff_report_renders(tmp_path):
    rep = handoff_report(status="unsupported", findings=[])
    for r in rep["results"]:
        r.clear()
    rep["results"] = [{"cuts": [c], "stages": [], "status": "unsupported", "offsets": 0,
                       "reason": "per-layer embeddings come from token ids"} for c in (1, 2, 3)]
    root = parse(handoff_picture(rep, tmp_path / "u.svg"))
    got = cells(root, 3)
    assert len(got) == 3 * 7 * 2 and set(got.values()) == {"unsupported"}
    assert gids(root, "marked:") == []
    assert "unsupported" in texts(root)


def test_report_without_layers_uses_kinds(tmp_path):
    rep = handoff_report(kinds="RAMB", n_layer=4, config=dict(CONFIG, modes=["full"]))
    del rep["layers"]
    rep["results"] = [{"cuts": [1], "status": "pass", "offsets": 7}, {"cuts": [2], "status": "pass", "offsets": 7}]
    root = parse(handoff_picture(rep, tmp_path / "k.svg"))
    assert gids(root, "layer:") == ["layer:0:recurrent", "layer:1:attention", "layer:2:mlp", "layer:3:both"]
    assert len(cells(root, 3)) == 2 * 7


def test_empty_report_renders(tmp_path):
    rep = handoff_report(results=[], status="crash", findings=[])
    root = parse(handoff_picture(rep, tmp_path / "e.svg"))
    assert gids(root, "cell:") == [] and len(gids(root, "layer:")) == 12
    assert battery_picture([], tmp_path / "b.svg").exists()


def test_sweep_grid(tmp_path):
    root = parse(sweep_picture(sweep_report(), tmp_path / "s.svg"))
    got = cells(root, 2)
    phases = ["prefill", "decode", "batched"]
    assert len(got) == 5 * 3
    assert [got[("3", p)] for p in phases] == ["not-judged", "finding", "not-judged"]
    assert [got[("5", p)] for p in phases] == ["unsupported"] * 3
    assert all(got[(c, p)] == "pass" for c in "124" for p in phases)
    assert gids(root, "marked:") == ["marked:3:decode"]
    assert gids(root, "diverges:") == ["diverges:3:4"]
    assert len(gids(root, "layer:")) == 12
    words = texts(root)
    assert set(phases) | {"1", "2", "3", "4", "5", "not judged", "unsupported"} <= words
    # the reason is truncated, not dropped
    assert any(t.startswith("the input LayerNorm") and t.endswith("…") for t in words)


def test_battery_grid(tmp_path):
    lanes = [{"row": "jamba", "lane": "sweep", "status": "pass"},
             {"row": "jamba", "lane": "handoff", "status": "finding"},
             {"row": "rwkv6", "lane": "sweep", "status": "unsupported"},
             {"row": "rwkv6", "lane": "handoff", "status": "pass"},
             {"row": "rwkv6", "lane": "isolation", "status": "known"},
             {"row": "llama", "lane": "isolation", "status": "numerics"},
             {"row": "llama", "lane": "sweep", "status": "missing"},
             {"row": "llama", "lane": "handoff", "status": "timeout"},
             {"row": "gemma2", "lane": "sweep", "status": "skipped"},
             {"row": "gemma2", "lane": "handoff", "status": "crash"},
             {"row": "gemma2", "lane": "isolation", "status": "pass"},
             {"row": "jamba", "lane": "isolation", "status": "pass"}]
    root = parse(battery_picture(lanes, tmp_path / "b.svg"))
    got = cells(root, 2)
    assert got == {(e["row"], e["lane"]): e["status"] for e in lanes}
    # rows as given, lanes by first appearance: document order of the cells
    order = [tuple(g.split(":")[1:3]) for g in gids(root, "cell:")]
    assert order == [(r, la) for r in ("jamba", "rwkv6", "llama", "gemma2") for la in ("sweep", "handoff", "isolation")]
    words = texts(root)
    assert {"jamba", "rwkv6", "llama", "gemma2", "sweep", "handoff", "isolation"} <= words
    assert {"pass", "finding", "unsupported", "known", "numerics", "missing", "timeout", "skipped", "crash"} <= words
    assert "not run" not in words  # every row has every lane: no absent cell, no legend entry for one


def test_battery_absent_lane_is_not_run(tmp_path):
    lanes = [{"row": "a", "lane": "sweep", "status": "pass"}, {"row": "b", "lane": "handoff", "status": "pass"}]
    got = cells(parse(battery_picture(lanes, tmp_path / "b.svg")), 2)
    assert got == {("a", "sweep"): "pass", ("a", "handoff"): "not-run", ("b", "sweep"): "not-run",
                   ("b", "handoff"): "pass"}


def test_report_picture_dispatch(tmp_path):
    assert report_picture(handoff_report(), tmp_path / "h.svg") == tmp_path / "h.svg"
    assert gids(parse(tmp_path / "h.svg"), "cell:full:")
    assert report_picture(sweep_report(), tmp_path / "s.svg") == tmp_path / "s.svg"
    assert report_picture({"oracle": "isolation"}, tmp_path / "i.svg") is None
    assert not (tmp_path / "i.svg").exists()


def test_palette_covers_every_status_the_pictures_draw():
    statuses = {"pass", "finding", "unsupported", "known", "numerics", "crash", "timeout", "missing", "skipped",
                "not-run", "not-judged"}
    assert statuses <= set(STATUS_COLOURS)
    # the verdicts a reader acts on differ in colour
    verdicts = ["pass", "finding", "crash", "timeout", "numerics", "known", "unsupported", "missing"]
    assert len({STATUS_COLOURS[s] for s in verdicts}) == len(verdicts)


def test_twelve_layer_handoff_is_small(tmp_path):
    results = [{"cuts": [c], "status": "pass", "offsets": 13} for c in range(1, 12)]
    rep = handoff_report(results=results, config=dict(CONFIG, prompt_len=12), findings=[])
    size = handoff_picture(rep, tmp_path / "h.svg").stat().st_size
    assert size < 90_000, size  # 11 cut sets × 13 offsets × 2 modes
