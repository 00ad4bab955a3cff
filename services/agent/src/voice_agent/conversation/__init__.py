"""One conversation whatever the door: the parts a conversation is made of and its
end-of-turn policy (parts.py, turn_end.py), the client's mic as stamped frames (mic.py),
the one bounded sender to the client (outbox.py), and the door every route opens the same
way (door.py: origin, API key, open sockets, slots, load). `/v1/talk`, `/v1/realtime` and
the LiveKit worker are adapters between their wire and these."""
