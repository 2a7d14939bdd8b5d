"""`synth`: make fixtures, list families, inspect any GGUF, cut stages, write and read layer packages."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated

import typer

from synth.cliutil import new_app, run
from synth.errors import UserError
from synth.families import ALIASES, FAMILIES, get_family
from synth.inspect import format_table, inspect_file
from synth.make import write_fixture
from synth.manifest import load_manifest
from synth.package import MANIFEST, materialize_stage, read_manifest, write_package
from synth.spec import FLAG, KNOB, Knobs, parse_int_list
from synth.stage import SourceModel, StageInfo, Unsupported, parse_range, stage_path

app = new_app("Tiny synthetic GGUF fixtures that the real llama.cpp loads and runs.")

Opt = typer.Option


@app.command()
def make(
    family: Annotated[str | None, typer.Argument(help="family name (see `synth list`) or the alias `hybrid`")] = None,
    row: Annotated[str | None, Opt(help="make the fixture a family_tiers.toml row describes")] = None,
    manifest: Annotated[Path | None, Opt(help="manifest for --row (default: ./family_tiers.toml)")] = None,
    out: Annotated[Path | None, Opt("-o", "--out", help="output file (default: ./FAMILY.gguf)")] = None,
    layers: Annotated[int | None, Opt(help=KNOB["layers"].help)] = None,
    period: Annotated[int | None, Opt(help=KNOB["period"].help)] = None,
    offset: Annotated[int | None, Opt(help=KNOB["offset"].help)] = None,
    pattern: Annotated[str | None, Opt(help=KNOB["pattern"].help)] = None,
    kv_heads: Annotated[str | None, Opt(help=KNOB["kv_heads"].help)] = None,
    embd: Annotated[int | None, Opt(help=KNOB["embd"].help)] = None,
    heads: Annotated[int | None, Opt(help=KNOB["heads"].help)] = None,
    head_dim: Annotated[int | None, Opt(help=KNOB["head_dim"].help)] = None,
    ff: Annotated[int | None, Opt(help=KNOB["ff"].help)] = None,
    vocab: Annotated[int | None, Opt(help=KNOB["vocab"].help)] = None,
    experts: Annotated[int | None, Opt(help=KNOB["experts"].help)] = None,
    experts_used: Annotated[int | None, Opt(help=KNOB["experts_used"].help)] = None,
    shared_experts: Annotated[int | None, Opt(help=KNOB["shared_experts"].help)] = None,
    leading_dense: Annotated[int | None, Opt(help=KNOB["leading_dense"].help)] = None,
    q_lora_rank: Annotated[int | None, Opt(help=KNOB["q_lora_rank"].help)] = None,
    kv_lora_rank: Annotated[int | None, Opt(help=KNOB["kv_lora_rank"].help)] = None,
    indexer: Annotated[bool | None, Opt("--indexer/--no-indexer", help=KNOB["indexer"].help)] = None,
    indexer_top_k: Annotated[int | None, Opt(help=KNOB["indexer_top_k"].help)] = None,
    sliding_window: Annotated[int | None, Opt(help=KNOB["sliding_window"].help)] = None,
    dtype: Annotated[str | None, Opt(help=KNOB["dtype"].help)] = None,
    seed: Annotated[int, Opt(help="weight seed")] = 0,
    as_json: Annotated[bool, Opt("--json", help="print the resolved spec and file facts as JSON")] = False,
) -> None:
    """Write the fixture for FAMILY with the given knobs (same knobs + seed → same bytes), or for a manifest --row."""
    knobs = Knobs(layers=layers, period=period, offset=offset, pattern=pattern,
                  kv_heads=parse_int_list(kv_heads, "--kv-heads") if kv_heads is not None else None,
                  embd=embd, heads=heads, head_dim=head_dim, ff=ff, vocab=vocab, experts=experts,
                  experts_used=experts_used, shared_experts=shared_experts, leading_dense=leading_dense,
                  q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                  indexer=indexer, indexer_top_k=indexer_top_k, sliding_window=sliding_window, dtype=dtype,
                  seed=seed)
    if row is not None:
        if family is not None or knobs.given():
            raise UserError("--row takes its family and knobs from the manifest; give --row alone (with -o/--seed)")
        r = load_manifest(manifest).row(row)
        if not r.runnable:
            raise UserError(f"row {row}: not runnable on the pinned llama.cpp: {r.reason}")
        fam = get_family(str(r.recipe["family"]))
        spec = fam.resolve(replace(r.knobs(), seed=seed))
        default_name = f"{row}.gguf"
    elif family is None:
        raise UserError("give a FAMILY (see `synth list`) or --row NAME (see `family-certify check`)")
    else:
        fam = get_family(family)
        spec = fam.resolve(knobs)
        default_name = f"{fam.name}.gguf"
    path = out or Path(default_name)
    size = write_fixture(spec, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if as_json:
        print(json.dumps({"path": str(path), "arch": fam.arch_name, "bytes": size, "sha256": digest,
                          "spec": json.loads(spec.to_json())}, indent=2))
    else:
        print(f"wrote {path}: family {fam.name} (arch {fam.arch_name}), {spec.n_layer} layers "
              f"{spec.pattern}, {size} bytes, sha256 {digest[:16]}")


@app.command("list")
def list_families(as_json: Annotated[bool, Opt("--json", help="machine-readable")] = False) -> None:
    """Families, their llama.cpp arch strings and the knobs each can express."""
    aliases = {v: k for k, v in ALIASES.items()}
    rows = [{"family": f.name, "arch": f.arch_name, "kind": f.kind,
             "knobs": [FLAG[k] for k in FLAG if k in f.knobs], "per_layer_kv": f.per_layer_kv,
             "alias": aliases.get(f.name), "summary": f.summary} for f in FAMILIES.values()]
    if as_json:
        print(json.dumps({"families": rows, "aliases": ALIASES}, indent=2))
        return
    for r in rows:
        alias = f"  (alias: {r['alias']})" if r["alias"] else ""
        print(f"{r['family']:<14} arch {r['arch']:<14} {r['kind']:<9} {r['summary']}{alias}")
        print(f"{'':<14} knobs: {' '.join(r['knobs'])}")


@app.command("inspect")
def inspect_cmd(
    file: Annotated[Path, typer.Argument(help="any GGUF model file")],
    as_json: Annotated[bool, Opt("--json", help="machine-readable")] = False,
) -> None:
    """Per layer: kind, K/V heads and widths, FFN kind, indexer — from the file alone."""
    info = inspect_file(str(file))
    print(json.dumps(info.to_dict(), indent=2) if as_json else format_table(info))


LAYERS_HELP = "source layers A:B (layers A..B-1; A or B may be left out), e.g. 0:4"


@app.command("slice")
def slice_cmd(
    file: Annotated[Path, typer.Argument(help="the model GGUF")],
    layers: Annotated[str, Opt("--layers", help=LAYERS_HELP)],
    out: Annotated[Path | None, Opt("-o", "--out", help="stage file (default: ./FILE.LAAA-BBB.gguf)")] = None,
    as_json: Annotated[bool, Opt("--json", help="machine-readable")] = False,
) -> None:
    """Write the stage holding layers A..B-1 of FILE: a GGUF the pinned llama.cpp loads, computing those layers."""
    src = SourceModel(file)
    a, b = parse_range(layers, src.info.n_layer)
    dst = out or stage_path(Path("."), file, a, b)
    try:
        st = src.slice(dst, a, b)
    except Unsupported as e:
        raise UserError(f"stage {a}:{b} of {file} cannot be expressed for the pinned llama.cpp: {e}") from None
    _report_stage(dst, st, as_json)


@app.command("package")
def package_cmd(
    file: Annotated[Path, typer.Argument(help="the model GGUF")],
    out: Annotated[Path, typer.Argument(help="package directory (created; our files in it are overwritten)")],
    model_id: Annotated[str | None, Opt("--model-id", help="model_id in the manifest (default: FILE's stem)")] = None,
    as_json: Annotated[bool, Opt("--json", help="print the manifest")] = False,
) -> None:
    """Split FILE into a layer package (skippy layer-package v1): shared files, one GGUF per layer, a manifest."""
    man = write_package(file, out, model_id)
    if as_json:
        print(json.dumps(man, indent=2, sort_keys=True))
        return
    arts = [*man["shared"].values(), *man["layers"]]
    print(f"wrote {out / MANIFEST}: model_id {man['model_id']}, {man['layer_count']} layer files + 3 shared files, "
          f"{sum(x['artifact_bytes'] for x in arts)} bytes")


@app.command("materialize")
def materialize_cmd(
    package: Annotated[Path, typer.Argument(help="package directory written by `synth package`")],
    layers: Annotated[str, Opt("--layers", help=LAYERS_HELP)],
    out: Annotated[Path | None, Opt("-o", "--out", help="stage file (default: ./PACKAGE.LAAA-BBB.gguf)")] = None,
    as_json: Annotated[bool, Opt("--json", help="machine-readable")] = False,
) -> None:
    """Assemble the stage A..B-1 from a layer package (sha256-verified): the same bytes as `synth slice`."""
    a, b = parse_range(layers, read_manifest(package)["layer_count"])
    dst = out or stage_path(Path("."), Path(package.resolve().name + ".gguf"), a, b)
    try:
        st = materialize_stage(package, a, b, dst)
    except Unsupported as e:
        raise UserError(f"stage {a}:{b} of {package} cannot be expressed for the pinned llama.cpp: {e}") from None
    _report_stage(dst, st, as_json)


def _report_stage(path: Path, st: StageInfo, as_json: bool) -> None:
    size = path.stat().st_size
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if as_json:
        print(json.dumps({"path": str(path), "bytes": size, "sha256": digest, "n_layer": st.n_layer, **asdict(st)},
                         indent=2))
        return
    pads = f"pads at stage layers {st.pads} (pass-through)" if st.pads else "no pads"
    print(f"wrote {path}: source layers {st.first}:{st.last} of {st.source} ({st.n_layer_source} layers); its layers "
          f"hold source layers {st.layers}, {pads}, {size} bytes, sha256 {digest[:16]}")


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "synth", argv))
