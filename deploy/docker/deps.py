"""Prints the third-party dependencies of the given pyproject.toml files, one per line,
leaving out the projects themselves (they are installed from source afterwards).

An image installs these in a layer of their own, before the sources are copied in: a code
change then rebuilds only the `pip install --no-deps` of our packages, in seconds, not
every dependency (minutes on 2 cores).
"""
import re
import sys
import tomllib
from pathlib import Path


def name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0].lower().replace("_", "-")


projects = [tomllib.loads(Path(p).read_text())["project"] for p in sys.argv[1:]]
ours = {p["name"].lower() for p in projects}
for p in projects:
    for req in p.get("dependencies", []):
        if name(req) not in ours:
            print(req)
