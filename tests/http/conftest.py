"""Integration tests of the real `text-embeddings-router` process on loopback.

Each module starts its servers once (module-scoped fixtures) and drives them with real
clients. Nothing here reaches a network beyond 127.0.0.1 or a model hub. The helpers live in
`router_harness.py` (a module of its own: `tests/conftest.py` is also named conftest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from router_harness import HERE, Server


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: starts the real server process (CPU, loopback only)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Factory: `start_server(model, *flags, env=..., default_pool=...)` (`default_pool`: the
    router's own tokenizer pool size, not the tests' two threads); every server is stopped at
    the end."""
    servers: list[Server] = []
    log_dir = tmp_path_factory.mktemp("router-logs")

    def start(
        model: Path | str, *args: str, env: dict | None = None, default_pool: bool = False
    ) -> Server:
        server = Server(model, log_dir, *args, env=env, default_pool=default_pool)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
