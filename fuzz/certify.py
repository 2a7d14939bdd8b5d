"""`family-certify`: the family-tier manifest (family_tiers.toml) and the lanes it drives."""

from __future__ import annotations

import sys

from synth.cliutil import new_app, run

app = new_app("Certify model families against the family-tier manifest.")


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(app, "family-certify", argv))
