import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  endState, HANDLED, INPUT_RATES, pageState, parseEvent, PROTOCOL, startMessage, stopMessage,
  voiceChoices, voicesUrl,
} from '../src/talk.js';

test('start message carries the mic rate; unsupported rates throw', () => {
  assert.deepEqual(JSON.parse(startMessage(48000)), { type: 'start', sample_rate: 48000 });
  assert.deepEqual(JSON.parse(startMessage(44100.0)), { type: 'start', sample_rate: 44100 });
  assert.throws(() => startMessage(96000), /unsupported mic rate 96000/);
  assert.deepEqual(JSON.parse(startMessage(48000, 'alice')),
    { type: 'start', sample_rate: 48000, voice: 'alice' });
  assert.deepEqual(JSON.parse(startMessage(48000, '')), { type: 'start', sample_rate: 48000 });
});

test('the voices list sits next to /v1/talk', () => {
  assert.equal(voicesUrl('ws://127.0.0.1:8003/v1/talk'), 'http://127.0.0.1:8003/v1/voices');
  assert.equal(voicesUrl('wss://agent.example.com/v1/talk'), 'https://agent.example.com/v1/voices');
  assert.equal(voicesUrl('wss://example.com/agent/v1/talk'), 'https://example.com/agent/v1/voices');
});

test('voiceChoices: the agent default selected, library voices labelled by kind', () => {
  const c = voiceChoices({ default: 'Serena', voices: [
    { name: 'serena', kind: 'preset' }, { name: 'alice', kind: 'clone' }, { name: 7 }] });
  assert.deepEqual(c, { selected: 'serena', voices: [
    { name: 'serena', label: 'serena' }, { name: 'alice', label: 'alice (clone)' }] });
  const missing = voiceChoices({ default: 'ghost', voices: [{ name: 'alice', kind: 'clone' }] });
  assert.equal(missing.selected, 'ghost');
  assert.equal(missing.voices[0].label, 'ghost (not on the TTS)');
  assert.equal(voiceChoices({ voices: 'x' }), null);
  assert.equal(voiceChoices(null), null);
  assert.equal(voiceChoices({ voices: [] }), null);
});

test('parseEvent keeps known, well-formed events only', () => {
  assert.equal(parseEvent('{"type":"ready","output_rate":24000}').output_rate, 24000);
  assert.equal(parseEvent('{"type":"state","state":"speaking"}').state, 'speaking');
  assert.equal(parseEvent('{"type":"transcript","role":"user","text":"hi"}').text, 'hi');
  assert.equal(parseEvent('{"type":"clear"}').type, 'clear');
  for (const bad of ['not json', '[1]', 'null', '{"type":"dance"}', '{"type":"ready"}',
    '{"type":"transcript","role":"bot","text":"x"}', '{"type":"state","state":3}']) {
    assert.equal(parseEvent(bad), null, bad);
  }
});

test('agent states map to page states; interrupting means the user has the floor', () => {
  assert.equal(pageState('thinking'), 'thinking');
  assert.equal(pageState('speaking'), 'speaking');
  assert.equal(pageState('interrupting'), 'listening');
  assert.equal(pageState('paused'), 'listening');
  assert.equal(pageState('listening'), 'listening');
});

test('endState says why the call ended', () => {
  const url = 'ws://127.0.0.1:8003/v1/talk';
  const [st, detail] = endState(url, { opened: false, code: 1006 });
  assert.equal(st, 'unreachable');
  assert.match(detail, /ws:\/\/127\.0\.0\.1:8003\/v1\/talk did not answer/);
  assert.match(detail, /TOKEN_AGENT_WS_URL/);
  assert.match(detail, /make up starts it/);
  const busy = endState(url, { opened: true, code: 1013,
    error: { code: 'busy', message: 'the agent is at capacity' } });
  assert.deepEqual(busy, ['refused', 'the agent ended the call: the agent is at capacity (busy)']);
  assert.equal(endState(url, { opened: true, code: 1000 })[0], 'disconnected');
  assert.match(endState(url, { opened: true, code: 1006 })[1], /dropped \(code 1006\)/);
});

test('the page speaks protocol.json: stop message, a handler for every server type', () => {
  assert.deepEqual(JSON.parse(stopMessage()), { type: 'stop' });
  assert.deepEqual(Object.keys(HANDLED).sort(), Object.keys(PROTOCOL.server).sort());
  assert.deepEqual(INPUT_RATES, PROTOCOL.input_rates);
});
