"""The sentences of the synthetic turn set (bench/turn_set.py), by label and kind.

An unfinished turn's `|` is where the speaker pauses inside the utterance (the silence
judged); the words before it are spoken as the start of a longer sentence. Kinds say what
the detectors should find hard:
- complete `wh-preposition`: a question ending on its stranded preposition, which the word
  rule releases ("What are you looking at?"); `particle`: ending on a verb's particle;
  `rule-holds`: complete, but ending on a word the rule holds on ("... looking for.");
- unfinished `after-to` / `after-the`: the word rule holds these; `after-clause`: the
  words so far could end a turn, only the voice says otherwise; `list`, `digits`,
  `after-um`.
"""

from __future__ import annotations

COMPLETE: dict[str, list[str]] = {
    "statement": [
        "I would like to book a table for two at seven.",
        "My flight lands at noon tomorrow.",
        "Please turn off the lights in the kitchen.",
        "I think the meeting was moved to Thursday.",
        "The package arrived this morning.",
        "We need three more chairs in the conference room.",
        "I lost my wallet on the bus yesterday.",
        "That sounds perfect, thank you.",
        "Set an alarm for six thirty.",
        "My daughter starts school next week.",
        "I already paid the electricity bill.",
        "Send the report to the whole team.",
    ],
    "question": [
        "What time does the museum open on Sunday?",
        "Can you tell me how to get to the nearest pharmacy?",
        "Is it going to rain this afternoon?",
        "How much does a ticket to Chicago cost?",
        "Do you know a good Italian restaurant nearby?",
        "Could you read me my last message?",
        "How long does it take to boil an egg?",
        "Where is the closest gas station?",
        "Did anyone call while I was out?",
        "When does the next bus leave?",
    ],
    "wh-preposition": [
        "Which platform does the next train to Boston leave from?",
        "What are you looking at?",
        "Who did you go with?",
        "Where are you from?",
        "What is this sauce made of?",
        "Which hotel are we staying at?",
        "Who should I send the invoice to?",
        "What are you talking about?",
        "Which drawer did you put the keys in?",
        "What kind of music are you into?",
    ],
    "particle": [
        "Can you turn the volume down?",
        "What time should I pick you up?",
        "Please write that down.",
        "The printer keeps breaking down.",
        "I need to calm down.",
        "Could you look it up?",
    ],
    "rule-holds": [
        "Let me know what you are looking for.",
        "That is the one I was thinking of.",
        "Which one do you want?",
        "It is nothing to be afraid of.",
    ],
}

UNFINISHED: dict[str, list[str]] = {
    "after-to": [
        "Can you tell me how to get to | the nearest pharmacy?",
        "I want to go to | the airport tomorrow morning.",
        "Please send the slides to | everyone on the list.",
        "Could you add a reminder to | my calendar for Friday?",
        "I would like to talk to | someone about my order.",
        "What is the best way to | get downtown from here?",
    ],
    "after-the": [
        "I left my keys in the | kitchen drawer.",
        "Can you book the | earliest flight to Denver?",
        "What is the weather like in the | mountains this weekend?",
        "Please turn up the | heating in the bedroom.",
        "I need to return the | shoes I bought last week.",
        "Tell me about the | history of this building.",
    ],
    "after-clause": [
        "I need a hotel room | with a view of the sea.",
        "Book a table for two | at the Italian place downtown.",
        "Call my sister | when you get a chance.",
        "Play some music | from the seventies.",
        "I would like a coffee | with oat milk and no sugar.",
        "Remind me to buy bread | on the way home.",
        "Find me a cheap flight | to Lisbon in March.",
        "Turn on the lights | in the living room.",
    ],
    "list": [
        "I need eggs, milk, | and bread.",
        "Add apples, bananas, | and grapes to the list.",
        "We invited Tom, Anna, | and the neighbours.",
        "Pack a towel, sunscreen, | and a hat.",
    ],
    "digits": [
        "My number is five five five | one two three four.",
        "The code is four seven | nine two.",
        "My account number is three one | eight eight six.",
        "The flight number is two zero | seven.",
    ],
    "after-um": [
        "I would like to um | order a pizza.",
        "Can you um | check my balance?",
        "Let us meet on um | Thursday afternoon.",
        "The thing is um | I forgot my password.",
    ],
}

BACKCHANNEL = ["Mm-hmm.", "Yeah.", "Okay.", "Right.", "Uh-huh.", "Sure.", "Yeah, yeah.",
               "Oh, okay.", "I see.", "Got it."]


def split_pause(text: str) -> tuple[str, str]:
    """An unfinished sentence -> (the words before the pause, the words after)."""
    before, sep, after = text.partition("|")
    assert sep, f"no '|' pause in {text!r}"
    return before.strip(), after.strip()
