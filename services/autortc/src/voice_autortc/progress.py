"""The progress display while the suite runs.

On a terminal: a rich progress bar with the current case and a running PASS/FAIL
count. Elsewhere (CI logs, `> log.txt`): one plain line per event, starting with `[`
so `grep -c '^\\[' log` counts finished cases (seed 003 14.3).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class SuiteProgress:
    def __init__(self, total: int, *, live: bool | None = None) -> None:
        self.total = total
        self.done = 0
        self.passed = 0
        self.failed = 0
        self._t0 = time.monotonic()
        self.live = sys.stderr.isatty() if live is None else live
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> SuiteProgress:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]AutoRTC[/]"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.description}"), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("starting", total=self.total)
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(et, e, tb)

    def _line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.log(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def status(self, text: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=text)
        else:
            print(f"  {text}", file=sys.stderr, flush=True)

    def start_case(self, case_id: str, attempt: int = 1) -> None:
        retry = f" (retry {attempt - 1})" if attempt > 1 else ""
        self.status(f"{case_id}{retry} · pass {self.passed} fail {self.failed}")

    def end_case(self, case_id: str, verdict: str, status: str, summary: str) -> None:
        self.done += 1
        if verdict == "PASS":
            self.passed += 1
        else:
            self.failed += 1
        el = time.monotonic() - self._t0
        self._line(f"[{self.done}/{self.total}] {case_id}: {verdict} capture={status} "
                   f"{summary} ({el:.0f} s)")
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1)
