// The agent's WebSocket protocol (services/agent/src/voice_agent/ws_session.py), the
// pure part: the start message, validating what the server sends, and what the page
// shows for each event or close. Unit-tested under node (web/test/talk.test.js).

export const INPUT_RATES = [8000, 16000, 22050, 24000, 32000, 44100, 48000];

/** The first message: the mic's sample rate (the agent resamples to what it needs). */
export function startMessage(sampleRate) {
  const rate = Math.round(sampleRate);
  if (!INPUT_RATES.includes(rate)) throw new Error(`unsupported mic rate ${sampleRate} Hz`);
  return JSON.stringify({ type: 'start', sample_rate: rate });
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
