"""Progress and the end-of-run summary: a tqdm bar on a terminal, JSON lines otherwise (a
log collector parses them; a bar's carriage returns would be noise there). Both on stderr,
with warnings and bad rows, so stdout stays free."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, TextIO

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from .rows import BadRow

MAX_BAD_ROW_MESSAGES = 100  # printed; the manifest keeps the count and the first 1000


@dataclass
class Summary:
    output: str
    rows: int = 0  # rows embedded by this run
    bad_rows: int = 0  # bad rows met by this run
    resumed_rows: int = 0  # input rows of shards finished by earlier runs
    shards: int = 0  # shards written by this run
    tokens: int = 0
    seconds: float = 0.0
    devices: dict[str, int] = field(default_factory=dict)  # tokens per device
    total_rows: Optional[int] = None
    complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        secs = max(self.seconds, 1e-9)
        return {
            "output": self.output,
            "complete": self.complete,
            "total_rows": self.total_rows,
            "rows": self.rows,
            "bad_rows": self.bad_rows,
            "resumed_rows": self.resumed_rows,
            "shards": self.shards,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows / secs, 1),
            "tokens_per_s": round(self.tokens / secs, 1),
            "devices": {
                name: {"tokens": tokens, "tokens_per_s": round(tokens / secs, 1)}
                for name, tokens in self.devices.items()
            },
        }

    def describe(self) -> str:
        d = self.as_dict()
        state = "done" if self.complete else "stopped"
        lines = [
            f"{state}: {d['rows']} rows embedded ({d['bad_rows']} bad, {d['resumed_rows']} "
            f"from earlier runs), {d['shards']} shards, {d['tokens']} tokens in "
            f"{d['seconds']:.1f} s: {d['rows_per_s']:.0f} rows/s, {d['tokens_per_s']:.0f} "
            f"tokens/s → {self.output}"
        ]
        for name, dev in d["devices"].items():
            lines.append(f"  {name}: {dev['tokens']} tokens, {dev['tokens_per_s']:.0f} tokens/s")
        return "\n".join(lines)


class Progress:
    def __init__(
        self,
        stream: Optional[TextIO] = None,
        json_lines: Optional[bool] = None,
        interval_s: float = 10.0,
    ) -> None:
        self.stream = stream or sys.stderr
        self.json_lines = json_lines if json_lines is not None else not _isatty(self.stream)
        self.interval_s = interval_s
        self.total_rows: Optional[int] = None
        self.done_rows = 0  # including rows finished by earlier runs
        self.rows = 0
        self.tokens = 0
        self.shards_done = 0
        self._bad_messages = 0
        self._started = time.monotonic()
        self._last_line = 0.0
        self._bar: Optional[tqdm[Any]] = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def start(self, total_rows: Optional[int], done_rows: int, shards_done: int) -> None:
        self._started = time.monotonic()
        self.total_rows, self.done_rows, self.shards_done = total_rows, done_rows, shards_done
        if not self.json_lines:
            self._bar = tqdm(
                total=total_rows,
                initial=done_rows,
                unit="row",
                unit_scale=True,
                dynamic_ncols=True,
                file=self.stream,
                desc="embedding",
            )
        self._emit_line(force=True)

    def estimate_total(self, total_rows: Optional[int]) -> None:
        """For JSONL/CSV the row count is known at the end only; the reader's bytes give an
        estimate (the bar's ETA)."""
        if total_rows is None or total_rows == self.total_rows:
            return
        self.total_rows = max(total_rows, self.done_rows)
        if self._bar is not None:
            self._bar.total = self.total_rows
            self._bar.refresh()

    def update(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.done_rows += rows
        self.tokens += tokens
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.tokens / max(self.elapsed, 1e-9):,.0f} tok/s", False)
            self._bar.update(rows)
        self._emit_line()

    def shard_done(self) -> None:
        self.shards_done += 1
        self._emit_line(force=True)

    def bad_row(self, bad: BadRow) -> None:
        self._bad_messages += 1
        if self._bad_messages <= MAX_BAD_ROW_MESSAGES:
            if self.json_lines:
                self._write(json.dumps({"event": "bad_row", **bad.as_dict()}))
            else:
                self._write(bad.describe())
        elif self._bad_messages == MAX_BAD_ROW_MESSAGES + 1:
            self.warn(f"more bad rows: only the first {MAX_BAD_ROW_MESSAGES} are printed")

    def warn(self, message: str) -> None:
        if self.json_lines:
            self._write(json.dumps({"event": "warning", "message": message}))
        else:
            self._write(f"warning: {message}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def summary(self, summary: Summary) -> None:
        self.close()
        if self.json_lines:
            self._write(json.dumps({"event": "summary", **summary.as_dict()}))
        else:
            self._write(summary.describe())

    def _emit_line(self, force: bool = False) -> None:
        if not self.json_lines:
            return
        now = time.monotonic()
        if not force and now - self._last_line < self.interval_s:
            return
        self._last_line = now
        elapsed = max(self.elapsed, 1e-9)
        rate = self.rows / elapsed
        eta = None
        if self.total_rows is not None and rate > 0:
            eta = round(max(self.total_rows - self.done_rows, 0) / rate, 1)
        self._write(
            json.dumps(
                {
                    "event": "progress",
                    "rows_done": self.done_rows,
                    "rows_total": self.total_rows,
                    "shards_done": self.shards_done,
                    "rows": self.rows,
                    "tokens": self.tokens,
                    "elapsed_s": round(elapsed, 3),
                    "rows_per_s": round(rate, 1),
                    "tokens_per_s": round(self.tokens / elapsed, 1),
                    "eta_s": eta,
                }
            )
        )

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
