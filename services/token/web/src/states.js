// The page's states and what a person reads for each. One state at a time; the
// conversation states (waiting/listening/thinking/speaking) are derived from the room.

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
  unreachable: 'Cannot reach server',
  refused: 'Server refused to connect',
  'token-error': 'Could not get a token',
  disconnected: 'Disconnected',
};

export const IN_CALL = new Set(['waiting', 'listening', 'thinking', 'speaking']);

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
