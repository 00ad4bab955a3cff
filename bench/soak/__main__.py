"""`python -m bench.soak`: see bench/soak/cli.py."""

from bench.soak.cli import main

main()
