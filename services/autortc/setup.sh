#!/usr/bin/env bash
# System packages AutoRTC needs, to run as much as to test, are the agent's test packages
# (espeak-ng: the users' speech of every case; sox): one script installs them.
exec bash "$(dirname "$0")/../agent/setup.sh" test
