"""`text-embeddings-router`: the console script in front of the Rust router.

Flags are parsed in Rust (`text-embeddings-router --help`); this only hands over `sys.argv`
and exits with the router's status.
"""

from __future__ import annotations

import signal
import sys


def router_main() -> None:
    from . import _router  # compiled by maturin; typed by _router.pyi

    # The router drains in-flight requests on SIGINT/SIGTERM itself. Python's SIGINT handler
    # would otherwise also fire, raising KeyboardInterrupt once the router returns and turning
    # a clean drain into a traceback and exit status 1.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_router.run(sys.argv))


if __name__ == "__main__":
    router_main()
