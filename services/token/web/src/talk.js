// The agent's WebSocket protocol, the pure part: the start, stop and feedback messages,
// validating what the server sends, and what the page shows for each event or close. The protocol
// itself (message types, fields, close codes, rates) is the agent's protocol.json, bundled
// in; services/agent/tests/test_talk_protocol.py checks the page and the agent agree.
// Unit-tested under node (web/test/talk.test.js).

import PROTOCOL from '../../../agent/src/voice_agent/talk/protocol.json' with { type: 'json' };

export { PROTOCOL };
export const INPUT_RATES = PROTOCOL.input_rates;
export const CLOSE = PROTOCOL.close_codes;

/**
 * The first message: the mic's sample rate (the agent resamples to what it needs) and,
 * if one was picked, the agent's voice for this call (a name from GET /v1/voices).
 */
export function startMessage(sampleRate, voice = '') {
  const rate = Math.round(sampleRate);
  if (!INPUT_RATES.includes(rate)) throw new Error(`unsupported mic rate ${sampleRate} Hz`);
  return JSON.stringify({ type: 'start', sample_rate: rate, ...(voice ? { voice } : {}) });
}

/** The last message: the page ends the conversation. */
export function stopMessage() {
  return JSON.stringify({ type: 'stop' });
}

// The turn-taking feedback buttons' labels: 'cut_off' ("You cut me off"), 'too_slow'.
export const FEEDBACK_LABELS = Object.keys(PROTOCOL.feedback_labels);

/** The user's verdict on the agent's latest end of turn (when `ready` said feedback). */
export function feedbackMessage(label) {
  if (!FEEDBACK_LABELS.includes(label)) throw new Error(`unknown feedback label ${label}`);
  return JSON.stringify({ type: 'feedback', label });
}

/** An error event after which the call goes on (a refused feedback), not its end. */
export function keepsCall(ev) {
  return ev.type === 'error' && PROTOCOL.kept_errors.includes(ev.code);
}

/** The agent's list of voices, next to its /v1/talk: ws(s)://host/v1/talk -> http(s)://host/v1/voices. */
export function voicesUrl(wsUrl) {
  const u = new URL(wsUrl);
  u.protocol = u.protocol === 'wss:' ? 'https:' : 'http:';
  u.pathname = u.pathname.replace(/\/v1\/talk\/?$/, '') + '/v1/voices';
  return u.toString();
}

/**
 * GET /v1/voices's body -> {voices: [{name, label}], selected} for the page's <select>
 * (the agent's default voice selected, listed even if the TTS lacks it), or null.
 */
export function voiceChoices(body) {
  if (!body || !Array.isArray(body.voices)) return null;
  const voices = body.voices
    .filter((v) => v && typeof v.name === 'string' && v.name)
    .map((v) => ({ name: v.name, label: typeof v.kind === 'string' && v.kind && v.kind !== 'preset'
      ? `${v.name} (${v.kind})` : v.name }));
  const def = typeof body.default === 'string' ? body.default : '';
  const found = voices.find((v) => v.name.toLowerCase() === def.toLowerCase());
  if (def && !found) voices.unshift({ name: def, label: `${def} (not on the TTS)` });
  if (!voices.length) return null;
  return { voices, selected: found ? found.name : (def || voices[0].name) };
}

// The fields the page acts on, by server message type (the rest it ignores), each
// checked by its type in protocol.json. Every type the server sends has an entry.
export const HANDLED = {
  ready: ['output_rate', 'feedback'],
  state: ['state'],
  caption: ['delta'],
  transcript: ['role', 'text'],
  latency: [], // parsed field by field (latency.js)
  clear: [],
  feedback_saved: ['id', 'label'],
  error: [],
};

// protocol.json's field types -> a check. A state the page does not know (a newer agent's)
// is still a state: pageState shows it as listening.
const KINDS = {
  int: Number.isInteger,
  number: Number.isFinite,
  string: (v) => typeof v === 'string',
  bool: (v) => typeof v === 'boolean',
  state: (v) => typeof v === 'string',
  role: (v) => PROTOCOL.roles.includes(v),
  error: (v) => typeof v === 'string',
};

function fieldOk(kind, value) {
  if (kind.endsWith('?') && value == null) return true;
  return KINDS[kind.replace(/\?$/, '')](value);
}

/** A text message from the agent -> a known event object, or null (ignored). */
export function parseEvent(text) {
  let msg;
  try {
    msg = JSON.parse(text);
  } catch {
    return null;
  }
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)
      || !Object.hasOwn(HANDLED, msg.type) || !Object.hasOwn(PROTOCOL.server, msg.type)) {
    return null;
  }
  const fields = PROTOCOL.server[msg.type].fields;
  if (!HANDLED[msg.type].every((f) => fieldOk(fields[f], msg[f]))) return null;
  if (msg.type === 'ready' && !(msg.output_rate > 0)) return null;
  return msg;
}

/** The page state for the agent's duplex state (paused, interrupting: the user has the floor). */
export function pageState(agentState) {
  return { thinking: 'thinking', speaking: 'speaking' }[agentState] ?? 'listening';
}

/**
 * Why the conversation ended -> [page state, detail]. `error` is the agent's last
 * {"type": "error"} event, if any; `opened` says whether the socket ever opened.
 */
export function endState(url, { opened, code, error }) {
  if (error) {
    const st = error.code === 'busy' ? 'refused' : 'disconnected';
    return [st, `the agent ended the call: ${error.message} (${error.code})`];
  }
  if (!opened) {
    return ['unreachable', `${url} did not answer. Is the agent running (make up starts ` +
      'it, or python -m voice_agent serve-direct), and is TOKEN_AGENT_WS_URL reachable ' +
      'from this browser?'];
  }
  if (code === CLOSE.normal) return ['disconnected', 'the agent ended the call'];
  if (code === CLOSE.going_away) return ['disconnected', 'the agent is shutting down'];
  return ['disconnected', `the connection to the agent dropped (code ${code})`];
}
