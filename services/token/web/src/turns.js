// The conversation turn by turn: what the agent heard the user say, what it answered, and
// that turn's end of turn -> first audio latency. The three arrive as separate events
// (transcripts and the latency record), so they are merged here; pure, unit-tested under
// node (web/test/turns.test.js). It knows nothing of the DOM or of either transport
// beyond turning LiveKit's transcription streams into the WebSocket's transcript events.
//
// Order on the agent's WebSocket: the user's transcript (turn committed), the latency
// record (first audio out), the answer's transcript (reply done or cut off). Over LiveKit
// the data message can overtake the user's transcript. Hence:
// - a user transcript opens a turn, unless the newest turn holds only a user turn's
//   latency record (a record with an end of turn that overtook its transcript);
// - a latency record joins the newest turn while that has neither record nor answer, else
//   opens its own (a greeting: its record has no end of turn);
// - an answer joins the newest turn while that has none, else opens its own.

export const MAX_TURNS = 20; // shown, newest first; older ones are dropped
export const TRANSCRIPTION_TOPIC = 'lk.transcription'; // livekit-agents' text streams
export const UNREADABLE = '·'; // what demo-chat prints for a character that is no text

// Python's str.isprintable() is false for these categories (and for every space but ' '):
// control, format, surrogate, private use, unassigned, line and paragraph separators.
const NOT_PRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\uFFFD]|(?! )\p{Zs}/gu;

/**
 * `text` as demo-chat shows it (voice_tts.client's `_readable`): each replacement
 * character (U+FFFD: bytes that were no UTF-8) and each character that is not printable
 * (controls, format characters, lone surrogates, unassigned, any space but ' ') becomes
 * UNREADABLE; newlines stay. A model with random weights babbles bytes like these.
 */
export function readable(text) {
  return text.replace(NOT_PRINTABLE, (c) => (c === '\n' ? c : UNREADABLE));
}

export class TurnLog {
  constructor(max = MAX_TURNS) {
    this.max = max;
    this.turns = []; // oldest first; {n, user, agent, interrupted, latency}
    this.count = 0; // turns ever opened: n of the newest
  }

  get newest() {
    return this.turns[this.turns.length - 1] ?? null;
  }

  open() {
    const turn = { n: ++this.count, user: null, agent: null, interrupted: false, latency: null };
    this.turns.push(turn);
    if (this.turns.length > this.max) this.turns.shift();
    return turn;
  }

  /** What the agent heard; empty text is no turn. */
  user(text) {
    if (!text.trim()) return null;
    const t = this.newest;
    const overtaken = t && t.user === null && t.agent === null
      && eotToFirstAudioMs(t) !== null;
    const turn = overtaken ? t : this.open();
    turn.user = text;
    return turn;
  }

  /** What the agent answered (interrupted: the user cut it off, maybe before any word). */
  agent(text, interrupted = false) {
    if (!text.trim() && !interrupted) return null;
    const t = this.newest;
    const turn = t && t.agent === null ? t : this.open();
    turn.agent = text;
    turn.interrupted = interrupted;
    return turn;
  }

  /** A parsed latency record (latency.js parseLatency); null is ignored. */
  latency(record) {
    if (!record) return null;
    const t = this.newest;
    const turn = t && t.latency === null && t.agent === null ? t : this.open();
    turn.latency = record;
    return turn;
  }

  /**
   * The latest exchange, for the page's "Conversation (latest)" lines: the user's words
   * and the answer of the same turn (the newest turn with any words; a turn holding only
   * a latency record that overtook its transcript does not count yet). null before any.
   * The answer is null while the agent has not answered this question.
   */
  latest() {
    for (let i = this.turns.length - 1; i >= 0; i--) {
      const t = this.turns[i];
      if (t.user !== null || t.agent !== null) return t;
    }
    return null;
  }

  /** Newest first, for display. */
  newestFirst() {
    return [...this.turns].reverse();
  }
}

export function eotToFirstAudioMs(turn) {
  return turn.latency?.eot_to_first_audio_ms ?? null;
}

/**
 * One LiveKit transcription text stream (topic "lk.transcription", read to its end) ->
 * {role, text} like the WebSocket's transcript event, or null. livekit-agents sends the
 * user's words under the user's identity and its own under the agent's; only final
 * segments count (`lk.transcription_final`, set on the header or, for a streamed answer,
 * on the trailer, which livekit-client merges into the attributes).
 */
export function liveKitTranscript({ attributes, sender, self, text }) {
  if (attributes?.['lk.transcription_final'] !== 'true' || !text?.trim()) return null;
  return { role: sender === self ? 'user' : 'assistant', text: text.trim() };
}
