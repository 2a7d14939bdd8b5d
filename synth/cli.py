"""`synth`: make fixtures, list families, inspect any GGUF."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from synth.cliutil import new_app, run
from synth.families import ALIASES, FAMILIES, get_family
from synth.families.base import FLAG
from synth.inspect import format_table, inspect_file
from synth.make import write_fixture
from synth.spec import Knobs, parse_int_list

app = new_app("Tiny synthetic GGUF fixtures that the real llama.cpp loads and runs.")

Opt = typer.Option


@app.command()
def make(
    family: Annotated[str, typer.Argument(help="family name (see `synth list`) or the alias `hybrid`")],
    out: Annotated[Path | None, Opt("-o", "--out", help="output file (default: ./FAMILY.gguf)")] = None,
    layers: Annotated[int | None, Opt(help="number of layers")] = None,
    period: Annotated[int | None, Opt(help="hybrids: one attention layer per PERIOD layers")] = None,
    offset: Annotated[int | None, Opt(help="hybrids: attention at layers i with i % PERIOD == OFFSET")] = None,
    pattern: Annotated[str | None, Opt(help="hybrids: explicit layer kinds, e.g. 'RRRA RRRA'")] = None,
    kv_heads: Annotated[str | None, Opt(help="K/V heads: one value, or one per layer ('2,0,1,0')")] = None,
    embd: Annotated[int | None, Opt(help="embedding width")] = None,
    heads: Annotated[int | None, Opt(help="attention heads")] = None,
    head_dim: Annotated[int | None, Opt(help="attention head dim")] = None,
    ff: Annotated[int | None, Opt(help="feed-forward width")] = None,
    vocab: Annotated[int | None, Opt(help="vocabulary size")] = None,
    experts: Annotated[int | None, Opt(help="MoE experts")] = None,
    experts_used: Annotated[int | None, Opt(help="MoE experts used per token")] = None,
    shared_experts: Annotated[int | None, Opt(help="MoE shared experts")] = None,
    leading_dense: Annotated[int | None, Opt(help="dense layers before the MoE layers")] = None,
    q_lora_rank: Annotated[int | None, Opt(help="MLA: compressed q rank (0 = plain attn_q)")] = None,
    kv_lora_rank: Annotated[int | None, Opt(help="MLA: latent KV rank")] = None,
    indexer: Annotated[bool | None, Opt("--indexer/--no-indexer", help="DSA indexer tensors")] = None,
    indexer_top_k: Annotated[int | None, Opt(help="DSA indexer top-k")] = None,
    seed: Annotated[int, Opt(help="weight seed")] = 0,
    as_json: Annotated[bool, Opt("--json", help="print the resolved spec and file facts as JSON")] = False,
) -> None:
    """Write the fixture for FAMILY with the given knobs (same knobs + seed → same bytes)."""
    fam = get_family(family)
    knobs = Knobs(layers=layers, period=period, offset=offset, pattern=pattern,
                  kv_heads=parse_int_list(kv_heads, "--kv-heads") if kv_heads is not None else None,
                  embd=embd, heads=heads, head_dim=head_dim, ff=ff, vocab=vocab, experts=experts,
                  experts_used=experts_used, shared_experts=shared_experts, leading_dense=leading_dense,
                  q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                  indexer=indexer, indexer_top_k=indexer_top_k, seed=seed)
    spec = fam.resolve(knobs)
    path = out or Path(f"{fam.name}.gguf")
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


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "synth", argv))
