// The agent's WebSocket protocol (services/agent/src/voice_agent/ws_session.py), the
// pure part: the start message, validating what the server sends, and what the page
// shows for each event or close. Unit-tested under node (web/test/talk.test.js).

export const INPUT_RATES = [8000, 16000, 22050, 24000, 32000, 44100, 48000];

/**
 * The first message: the mic's sample rate (the agent resamples to what it needs) and,
 * if one was picked, the agent's voice for this call (a name from GET /v1/voices).
 */
export function startMessage(sampleRate, voice = '') {
  const rate = Math.round(sampleRate);
  if (!INPUT_RATES.includes(rate)) throw new Error(`unsupported mic rate ${sampleRate} Hz`);
  return JSON.stringify({ type: 'start', sample_rate: rate, ...(voice ? { voice } : {}) });
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

const KNOWN = new Set(['ready', 'state', 'transcript', 'latency', 'clear', 'error']);

/** A text message from the agent -> a known event object, or null (ignored). */
export function parseEvent(text) {
  let msg;
  try {
    msg = JSON.parse(text);
  } catch {
    return null;
  }
  if (!msg || typeof msg !== 'object' || Array.isArray(msg) || !KNOWN.has(msg.type)) {
    return null;
  }
  if (msg.type === 'ready' && !(Number.isInteger(msg.output_rate) && msg.output_rate > 0)) {
    return null;
  }
  if (msg.type === 'transcript' && (typeof msg.text !== 'string'
      || !['user', 'assistant'].includes(msg.role))) return null;
  if (msg.type === 'state' && typeof msg.state !== 'string') return null;
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
  if (code === 1000) return ['disconnected', 'the agent ended the call'];
  if (code === 1001) return ['disconnected', 'the agent is shutting down'];
  return ['disconnected', `the connection to the agent dropped (code ${code})`];
}
