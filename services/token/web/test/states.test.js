// Conversation state from the room's remote participants (node --test; run by
// services/token/tests/test_web_unit.py). Participants are plain objects with the
// fields livekit-client's RemoteParticipant has: isAgent, attributes, isSpeaking.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { conversationState, IN_CALL, STATES } from '../src/states.js';

const agent = (state, extra = {}) => ({
  isAgent: true, isSpeaking: false, attributes: state ? { 'lk.agent.state': state } : {}, ...extra,
});
const human = (extra = {}) => ({ isAgent: false, isSpeaking: false, attributes: {}, ...extra });

test('no one else in the room: waiting for the agent', () => {
  assert.equal(conversationState([]), 'waiting');
});

test('livekit-agents lk.agent.state drives the state', () => {
  assert.equal(conversationState([agent('initializing')]), 'waiting');
  assert.equal(conversationState([agent('listening')]), 'listening');
  assert.equal(conversationState([agent('thinking')]), 'thinking');
  assert.equal(conversationState([agent('speaking')]), 'speaking');
  // The attribute wins over the SFU's speaking flag (the agent may be in its tail).
  assert.equal(conversationState([agent('listening', { isSpeaking: true })]), 'listening');
});

test('the agent is found among other participants', () => {
  assert.equal(conversationState([human({ isSpeaking: true }), agent('thinking')]), 'thinking');
});

test('a bot without the attribute falls back to isSpeaking', () => {
  assert.equal(conversationState([agent(null, { isSpeaking: true })]), 'speaking');
  assert.equal(conversationState([human()]), 'listening');
});

test('every state has a label; in-call states are a subset', () => {
  for (const s of IN_CALL) assert.ok(STATES[s], s);
  for (const s of ['connecting', 'unreachable', 'token-error']) assert.ok(STATES[s], s);
  assert.equal(STATES.unreachable, 'Cannot reach server');
});
