"""One conversation whatever the door (core.py `Conversation`: the session, its duplex
controller and turn tracker, the door's audio, started and closed one way): the parts it
is made of and its end-of-turn policy (parts.py, turn_end.py), the client's mic as
stamped frames (mic.py), its paced speaker (speaker.py), the one bounded sender to the
client (outbox.py), and the door every route opens the same way (door.py: origin, API
key, open sockets, slots, load). For a door that reports a conversation item by item (the
Realtime API): what it may set (options.py), its items and their context (items.py), its
user turns (user_turns.py) and its replies (replies.py). `/v1/talk`, `/v1/realtime`,
direct mode and the LiveKit worker are adapters between their wire and these."""
