"""Where a process's CPU time goes, by thread: the router's threads are named (`model-backend`,
`model-backend-1`, `tokenizer-3`, `router-http`, tokio's `tokio-runtime-w`), so reading every
thread's CPU time from /proc before and after a window says which part is busy, without a
profiler or ptrace rights.

    before = ThreadCpu.read(pid)
    ...                                   # the window
    print(ThreadCpu.read(pid).since(before).summary())

Threads are grouped by name with a trailing index dropped (`tokenizer-0` … `tokenizer-11` are
one group): each group's figure is CPU seconds per wall second (1.00 = one core busy), with its
busiest thread beside it. Linux only.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
INDEX = re.compile(r"[-_:]?\d+$")


def group_of(name: str) -> str:
    """`tokenizer-11` -> `tokenizer`; `model-backend-3` -> `model-backend`."""
    return INDEX.sub("", name) or name


@dataclass
class ThreadCpu:
    """CPU seconds (user + system) of each thread of one process at one instant."""

    at: float
    seconds: dict[int, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def read(cls, pid: int) -> ThreadCpu:
        out = cls(time.monotonic())
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            # The name is in parentheses and may hold spaces: fields after it are fixed.
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            utime, stime = int(fields[11]), int(fields[12])
            out.seconds[int(task.name)] = (name, (utime + stime) / TICKS)
        return out

    def since(self, before: ThreadCpu) -> Window:
        wall = self.at - before.at
        groups: dict[str, list[float]] = defaultdict(list)
        for tid, (name, cpu) in self.seconds.items():
            start = before.seconds.get(tid, (name, 0.0))[1]
            groups[group_of(name)].append((cpu - start) / wall)
        return Window(wall, dict(groups))


@dataclass
class Window:
    wall_s: float
    # group -> each thread's CPU seconds per wall second
    busy: dict[str, list[float]]

    def total(self) -> float:
        return sum(sum(v) for v in self.busy.values())

    def summary(self, top: int = 8) -> str:
        """`tokenizer ×12 3.41 (max 0.31); model-backend ×4 3.70 (max 0.95); …`"""
        rows = sorted(self.busy.items(), key=lambda kv: -sum(kv[1]))[:top]
        parts = [
            f"{name} ×{len(v)} {sum(v):.2f} (max {max(v):.2f})"
            if len(v) > 1
            else f"{name} {v[0]:.2f}"
            for name, v in rows
        ]
        return f"{self.total():.2f} cores over {self.wall_s:.1f} s: " + "; ".join(parts)
