// The latency data-message schema (topic "latency"): parsing and the per-turn stats.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { formatMs, LATENCY_FIELDS, LatencyStats, parseLatency } from '../src/latency.js';

const enc = (obj) => new TextEncoder().encode(typeof obj === 'string' ? obj : JSON.stringify(obj));

test('the three fields of the README schema', () => {
  assert.deepEqual(LATENCY_FIELDS, ['eot_to_first_audio_ms', 'llm_ttft_ms', 'tts_ttfa_ms']);
  assert.deepEqual(
    parseLatency(enc({ eot_to_first_audio_ms: 500, llm_ttft_ms: 80.5, tts_ttfa_ms: 120, x: 1 })),
    { eot_to_first_audio_ms: 500, llm_ttft_ms: 80.5, tts_ttfa_ms: 120 },
  );
  assert.deepEqual(parseLatency(enc({ llm_ttft_ms: 0 })), { llm_ttft_ms: 0 });
});

test('malformed messages are dropped, bad fields skipped', () => {
  for (const bad of ['', '{', 'null', '[1]', '"x"', '{}', '{"llm_ttft_ms": "80"}',
    '{"llm_ttft_ms": -1}', '{"llm_ttft_ms": 1e9}', '{"other": 5}']) {
    assert.equal(parseLatency(enc(bad)), null, bad);
  }
  assert.deepEqual(parseLatency(enc({ llm_ttft_ms: 'x', tts_ttfa_ms: 90 })), { tts_ttfa_ms: 90 });
  assert.equal(parseLatency(new Uint8Array([0xff, 0xfe])), null);
});

test('last and median over the window', () => {
  const s = new LatencyStats();
  assert.equal(s.last('llm_ttft_ms'), null);
  assert.equal(formatMs(s.median('llm_ttft_ms')), '–');
  for (const v of [100, 300, 200]) s.add({ llm_ttft_ms: v });
  assert.equal(s.last('llm_ttft_ms'), 200);
  assert.equal(s.median('llm_ttft_ms'), 200);
  s.add({ llm_ttft_ms: 1000 });
  assert.equal(s.median('llm_ttft_ms'), 250);
  assert.equal(s.add(null), false);
  assert.equal(s.dropped, 1);
  assert.equal(s.turns, 4);
  for (let i = 0; i < 100; i += 1) s.add({ llm_ttft_ms: 50 });
  assert.equal(s.values.llm_ttft_ms.length, 50); // bounded window
  assert.equal(formatMs(80.6), '81 ms');
});
