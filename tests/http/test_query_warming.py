"""`--query-warm-us`: between queries, the interactive thread re-runs a query's host steps
through the runtime's `warm_query`. A failing warm (here a device error on every call) is
only logged: queries keep their answers, and the device is not taken out."""

from __future__ import annotations

import time
from pathlib import Path

WARM_BACKEND = ["--python-backend-class", "backends:WarmFailingBackend"]


def _queries(server, count: int) -> list[list[float]]:  # type: ignore[no-untyped-def]
    """`count` identical queries, each 10 ms after the last answer (inside the interactive
    thread's 25 ms spin, where it warms once the bulk thread has idled 5 ms)."""
    rows = []
    for _ in range(count):
        response = server.post("/embed", {"inputs": "how do I reset my password"})
        assert response.status_code == 200, response.text
        rows.append(response.json()[0])
        time.sleep(0.010)
    return rows


def test_a_failing_warm_costs_queries_nothing(start_server, minilm_dir, tmp_path: Path):  # type: ignore[no-untyped-def]
    log = tmp_path / "warms.log"
    log.touch()
    server = start_server(minilm_dir, *WARM_BACKEND, env={"TRT_TEI_TEST_WARM_LOG": str(log)})
    rows = _queries(server, 8)
    assert all(row == rows[0] for row in rows)
    # Warmed between the queries, and every warm failed.
    assert log.read_text().splitlines().count("0") >= 1
    assert server.get("/health").status_code == 200


def test_no_warming_with_the_flag_at_zero(start_server, minilm_dir, tmp_path: Path):  # type: ignore[no-untyped-def]
    log = tmp_path / "warms.log"
    log.touch()
    server = start_server(
        minilm_dir, *WARM_BACKEND, "--query-warm-us", "0", env={"TRT_TEI_TEST_WARM_LOG": str(log)}
    )
    _queries(server, 4)
    assert log.read_text() == ""
