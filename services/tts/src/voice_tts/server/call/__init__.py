"""The one synthesis call, whatever the protocol: admission, the first-config rule, the
engine session, the stream (`synthesis`), its streaming rules (`stream`), pacing,
framing, the SessionConfig rules (`protocol`), and what goes in and out of it
(`messages`: the call's own types; protobuf stays in `fronts/service.py`)."""
