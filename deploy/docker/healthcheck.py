"""Container health probe: GET http://127.0.0.1:$PORT/healthz; exit 0 only on a 2xx.

Usage: healthcheck.py PORT_ENV_VAR (e.g. TTS_HTTP_PORT). The port comes from the same
variable the service reads, so a port changed in .env moves the probe with it. Standard
library only: it runs in every image, slim or CUDA.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: healthcheck.py PORT_ENV_VAR", file=sys.stderr)
        return 2
    port = os.environ.get(argv[1], "")
    if not port.isdigit():
        print(f"{argv[1]}={port!r} is not a port number", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return 0 if 200 <= resp.status < 300 else 1
    except (urllib.error.URLError, OSError) as e:
        print(f"{url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
