"""Progress for long runs: a rich progress bar on a terminal; on anything else (a CI log, a pipe) only the plain,
ANSI-free result lines, so logs stay greppable. FAMILY_CERTIFY_PROGRESS=plain|rich overrides the detection.
One bar at a time: a Progress opened while another is live (an oracle's inside the battery's) stays silent."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

_live: list[Progress] = []  # the bar on screen, if any
_lock = threading.Lock()


def interactive(stream: Any = None) -> bool:
    forced = os.environ.get("FAMILY_CERTIFY_PROGRESS", "")
    if forced in ("plain", "rich"):
        return forced == "rich"
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"


class Progress:
    """`with Progress(total, "lanes") as p:` … `p.working("jamba handoff")` while a unit runs, `p.line(text)` when
    it is done (printed above the bar on a terminal, a plain line elsewhere), `p.advance()` for units with no line."""

    def __init__(self, total: int, unit: str, *, stream: Any = None):
        self.total, self.unit = total, unit
        self.stream = stream or sys.stdout
        self.rich = interactive(self.stream)
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        with _lock:
            self.rich = self.rich and not _live
            if self.rich:
                _live.append(self)
        if self.rich:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn(self.unit), TimeElapsedColumn(), console=Console(file=self.stream),
                            transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
            with _lock:
                _live.remove(self)

    def working(self, what: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=what)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def at(self, n: int) -> None:
        """n units done (a counter the work reports itself)."""
        if self._bar is not None:
            self._bar.update(self._task, completed=min(n, self.total))

    def line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._bar.advance(self._task, 1)
        else:
            print(text, file=self.stream, flush=True)
