#!/usr/bin/env bash
# System packages AutoRTC needs are the agent's (espeak-ng: the users' speech of every
# case; sox): one script installs them.
exec bash "$(dirname "$0")/../agent/setup.sh"
