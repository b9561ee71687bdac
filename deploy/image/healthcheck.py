#!/usr/bin/env python3
"""The image's HEALTHCHECK: exit 0 when the router's /health answers 200, else 1.

Standard library only (the image has no curl, and importing torch every 15 s would cost
seconds of CPU). It asks the router on the address and port it was told to listen on:
`PORT` (default 8080) and `HOSTNAME`, with the wildcard addresses reached over loopback.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def health_url(env: dict[str, str]) -> str:
    host = env.get("HOSTNAME", "")
    host = "127.0.0.1" if host in WILDCARDS else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{env.get('PORT', '8080')}/health"


def main() -> int:
    url = health_url(dict(os.environ))
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
