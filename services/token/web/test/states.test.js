// Conversation state from the room's remote participants (node --test; run by
// services/token/tests/test_web_unit.py). Participants are plain objects with the
// fields livekit-client's RemoteParticipant has: isAgent, attributes, isSpeaking.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  conversationState, healthUrl, IN_CALL, micNotice, noAgentDetail, noAgentState, settleState,
  STATES,
} from '../src/states.js';

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

test('no agent within the bound: only a call still waiting becomes "no-agent"', () => {
  assert.equal(noAgentState('waiting'), 'no-agent');
  for (const s of ['listening', 'thinking', 'speaking', 'idle', 'disconnected', 'no-agent']) {
    assert.equal(noAgentState(s), s);
  }
  assert.equal(STATES['no-agent'], 'No agent answered');
  assert.ok(IN_CALL.has('no-agent')); // Leave works, and a late agent takes over
});

test('"no-agent" stays until an agent shows up', () => {
  assert.equal(settleState('no-agent', 'waiting'), 'no-agent'); // a room event, still no one
  assert.equal(settleState('no-agent', 'listening'), 'listening'); // the agent joined
  assert.equal(settleState('listening', 'waiting'), 'waiting'); // the agent left: wait again
  assert.equal(settleState('connecting', 'waiting'), 'waiting');
});

test('the no-agent message says what to check, per transport', () => {
  const lk = noAgentDetail('livekit', 'voice-demo', 10000);
  assert.match(lk, /No agent joined room voice-demo within 10 s/);
  assert.match(lk, /make up/);
  assert.match(lk, /docker compose ps/);
  assert.match(lk, /\/healthz/);
  assert.match(lk, /TOKEN_AGENT_NAME/);
  const ws = noAgentDetail('websocket', 'ws://127.0.0.1:8003/v1/talk', 1500);
  assert.match(ws, /^ws:\/\/127\.0\.0\.1:8003\/v1\/talk accepted the call/);
  assert.match(ws, /no agent answered within 1\.5 s/);
  assert.match(ws, /http:\/\/127\.0\.0\.1:8003\/healthz/);
  assert.equal(healthUrl('wss://voice.example.com/agent/v1/talk'),
    'https://voice.example.com/healthz');
  assert.equal(healthUrl('not a url'), "the agent's /healthz");
});

test('a microphone failure says what happened and how to fix it', () => {
  const err = (name, message = '') => Object.assign(new Error(message), { name });
  const denied = micNotice(err('NotAllowedError', 'Permission denied'));
  assert.match(denied, /microphone is blocked/);
  assert.match(denied, /Allow it/);
  assert.match(denied, /Leave and Join again/);
  assert.match(denied, /agent cannot hear you/);
  assert.match(micNotice(err('NotFoundError')), /No microphone found/);
  assert.match(micNotice(err('NotReadableError')), /another app/);
  assert.match(micNotice(err('TypeError', 'odd')), /Microphone unavailable: odd\./);
  // not a secure context: navigator.mediaDevices is missing, whatever the error says
  assert.match(micNotice(new TypeError('undefined'), false),
    /https:\/\/ pages and http:\/\/localhost/);
});
