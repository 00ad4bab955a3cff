// The page's states and what a person reads for each. One state at a time; the
// conversation states (waiting/listening/thinking/speaking) are derived from the room, or
// from the agent's events on its WebSocket. "no-agent" is the page's own: connected, but
// still waiting when the agent's bound (TOKEN_AGENT_TIMEOUT_SECONDS) ran out.

export const STATES = {
  loading: 'Loading…',
  idle: 'Ready',
  token: 'Getting a token…',
  connecting: 'Connecting…',
  reconnecting: 'Reconnecting…',
  waiting: 'Waiting for the agent…',
  listening: 'Listening',
  thinking: 'Thinking…',
  speaking: 'Agent speaking',
  'no-agent': 'No agent answered',
  unreachable: 'Cannot reach server',
  refused: 'Server refused to connect',
  'token-error': 'Could not get a token',
  disconnected: 'Disconnected',
};

// "no-agent" is in the call: Leave and Mute work, and an agent that turns up late takes over.
export const IN_CALL = new Set(['waiting', 'no-agent', 'listening', 'thinking', 'speaking']);

/**
 * Conversation state from the remote participants. livekit-agents publishes its state in
 * the `lk.agent.state` attribute (initializing/listening/thinking/speaking); a plain bot
 * without it falls back to the SFU's speaking flag.
 */
export function conversationState(participants) {
  const list = [...participants];
  const agent = list.find((p) => p.isAgent) ?? list[0];
  if (!agent) return 'waiting';
  const s = agent.attributes?.['lk.agent.state'];
  if (s === 'speaking') return 'speaking';
  if (s === 'thinking') return 'thinking';
  if (s === 'initializing') return 'waiting';
  if (!s && agent.isSpeaking) return 'speaking';
  return 'listening';
}

/** The state once the agent's bound ran out: still waiting means no agent answered. */
export function noAgentState(shown) {
  return shown === 'waiting' ? 'no-agent' : shown;
}

/**
 * A derived conversation state against the one shown: "no-agent" stays while the room
 * still says "waiting" (else any room event would flip it back and restart the wait).
 */
export function settleState(shown, derived) {
  return shown === 'no-agent' && derived === 'waiting' ? 'no-agent' : derived;
}

/** What to check when no agent answered, per transport (`where`: the room or the socket URL). */
export function noAgentDetail(transport, where, timeoutMs) {
  const within = `within ${timeoutMs / 1000} s`;
  if (transport === 'websocket') {
    return `${where} accepted the call, but no agent answered ${within}. Is the agent ` +
      `service running and healthy (make up starts it; check ${healthUrl(where)})?`;
  }
  return `No agent joined room ${where} ${within}. Is the agent service running? make up ` +
    'starts it; check docker compose ps (agent healthy), docker compose logs agent, or ' +
    "the agent's /healthz (port 8003). With TOKEN_AGENT_NAME set, it must match the " +
    "agent's registered name.";
}

/** The agent's /healthz from its WebSocket URL (same host and port, http). */
export function healthUrl(wsUrl) {
  try {
    const u = new URL(wsUrl);
    return `${u.protocol === 'wss:' ? 'https' : 'http'}://${u.host}/healthz`;
  } catch {
    return "the agent's /healthz";
  }
}

/**
 * getUserMedia failed -> the sentence the page shows: what happened and how to fix it.
 * `secure` is window.isSecureContext (browsers give the mic to https:// and localhost only).
 */
export function micNotice(err, secure = true) {
  const still = ' Until then the agent cannot hear you (you can still hear it).';
  if (!secure) {
    return 'This browser gives the microphone only to https:// pages and http://localhost: ' +
      `open the page through one of them.${still}`;
  }
  const name = err?.name ?? '';
  if (['NotAllowedError', 'SecurityError', 'PermissionDeniedError'].includes(name)) {
    return 'The microphone is blocked for this page. Allow it (the icon at the left of the ' +
      `address bar, or the browser's site settings), then press Leave and Join again.${still}`;
  }
  if (['NotFoundError', 'OverconstrainedError', 'DevicesNotFoundError'].includes(name)) {
    return `No microphone found. Connect one, then press Leave and Join again.${still}`;
  }
  if (['NotReadableError', 'AbortError', 'TrackStartError'].includes(name)) {
    return 'The microphone could not start (another app may be using it). Free it, then ' +
      `press Leave and Join again.${still}`;
  }
  return `Microphone unavailable: ${err?.message || name || 'unknown error'}.${still}`;
}
