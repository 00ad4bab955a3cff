"""The one synthesis call, whatever the protocol: admission, the first-config rule, the
engine session, the stream (`synthesis`), its streaming rules (`stream`), pacing,
framing, and the SessionConfig rules (`protocol`)."""
