"""AutoRTC: automated end-to-end voice tests (see README.md)."""
