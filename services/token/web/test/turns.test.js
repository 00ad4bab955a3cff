// The turn list: transcripts and latency records merged into turns, in the orders the two
// transports deliver them (node --test; run by services/token/tests/test_web_unit.py).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { parseLatency } from '../src/latency.js';
import {
  eotToFirstAudioMs, liveKitTranscript, MAX_TURNS, readable, TurnLog, UNREADABLE,
} from '../src/turns.js';

const record = (fields) => parseLatency(JSON.stringify(fields));
const brief = (log) => log.newestFirst().map((t) => [t.n, t.user, t.agent, eotToFirstAudioMs(t)]);

test('the WebSocket order: greeting, then user turns with their latency', () => {
  const log = new TurnLog();
  // the greeting: its record (no end of turn) at first audio, its text when it ends
  log.latency(record({ trace_id: 'g', eot_to_first_audio_ms: null, tts_ttfa_ms: 90 }));
  log.agent('Hello! How can I help?');
  log.user('what is the weather');
  log.latency(record({ eot_to_first_audio_ms: 512.3, llm_ttft_ms: 80 }));
  log.agent('Sunny.');
  log.user('thanks');
  log.latency(record({ eot_to_first_audio_ms: 430 }));
  log.agent('You are welcome', true);
  assert.deepEqual(brief(log), [
    [3, 'thanks', 'You are welcome', 430],
    [2, 'what is the weather', 'Sunny.', 512.3],
    [1, null, 'Hello! How can I help?', null],
  ]);
  assert.equal(log.newest.interrupted, true);
  assert.equal(log.turns[0].latency.tts_ttfa_ms, 90);
});

test('a latency record that overtakes its transcript (LiveKit) stays with its turn', () => {
  const log = new TurnLog();
  log.agent('Hi there.'); // a greeting without a record
  log.latency(record({ eot_to_first_audio_ms: 600 }));
  log.user('hello');
  log.agent('Hello again.');
  assert.deepEqual(brief(log), [
    [2, 'hello', 'Hello again.', 600],
    [1, null, 'Hi there.', null],
  ]);
});

test('a greeting record is never taken for a user turn', () => {
  const log = new TurnLog();
  log.latency(record({ tts_ttfa_ms: 100 })); // greeting still playing: no text yet
  log.user('hi'); // the user talks over it: a turn of its own
  assert.deepEqual(brief(log), [[2, 'hi', null, null], [1, null, null, null]]);
});

test('turns without an answer, answers without a turn, empty texts', () => {
  const log = new TurnLog();
  log.user('one');
  log.user('two'); // no answer to "one": two turns
  log.agent('answer');
  log.agent('more'); // the agent speaks again on its own: a turn of its own
  assert.equal(log.user('  '), null);
  assert.equal(log.agent(''), null);
  assert.equal(log.latency(null), null);
  assert.ok(log.agent('', true)); // cut off before its first word: still a turn
  assert.deepEqual(brief(log).map(([n, u, a]) => [n, u, a]),
    [[4, null, ''], [3, null, 'more'], [2, 'two', 'answer'], [1, 'one', null]]);
});

test('the list is bounded: the newest MAX_TURNS are kept, numbering goes on', () => {
  const log = new TurnLog();
  for (let i = 1; i <= MAX_TURNS + 5; i += 1) {
    log.user(`u${i}`);
    log.latency(record({ eot_to_first_audio_ms: i }));
    log.agent(`a${i}`);
  }
  assert.equal(log.turns.length, MAX_TURNS);
  assert.equal(log.count, MAX_TURNS + 5);
  const shown = log.newestFirst();
  assert.equal(shown[0].n, MAX_TURNS + 5);
  assert.equal(shown[0].user, `u${MAX_TURNS + 5}`);
  assert.equal(eotToFirstAudioMs(shown[0]), MAX_TURNS + 5);
  assert.equal(shown.at(-1).n, 6);
});

test('LiveKit transcription streams: final segments only, role by sender', () => {
  const final = { 'lk.transcription_final': 'true', 'lk.segment_id': 'SG_1' };
  const interim = { 'lk.transcription_final': 'false', 'lk.segment_id': 'SG_1' };
  const me = 'web-1a2b3c4d';
  assert.deepEqual(liveKitTranscript({ attributes: final, sender: me, self: me, text: ' hi ' }),
    { role: 'user', text: 'hi' });
  assert.deepEqual(
    liveKitTranscript({ attributes: final, sender: 'agent-AJ_x', self: me, text: 'Hello.' }),
    { role: 'assistant', text: 'Hello.' });
  assert.equal(liveKitTranscript({ attributes: interim, sender: me, self: me, text: 'h' }), null);
  assert.equal(liveKitTranscript({ attributes: {}, sender: me, self: me, text: 'h' }), null);
  assert.equal(liveKitTranscript({ attributes: final, sender: me, self: me, text: ' ' }), null);
});

// "Conversation (latest)" shows latest()'s question and answer: one turn's, never the new
// question next to the previous answer (issue 51, item 14).
const pair = (log) => {
  const t = log.latest();
  return t && [t.user, t.agent];
};

test('the latest exchange pairs each question with its own answer', () => {
  const log = new TurnLog();
  assert.equal(log.latest(), null);
  log.latency(record({ tts_ttfa_ms: 90 })); // the greeting plays: no words yet
  assert.equal(log.latest(), null);
  log.agent('Hello! How can I help?');
  assert.deepEqual(pair(log), [null, 'Hello! How can I help?']);
  log.user('what is the weather');
  assert.deepEqual(pair(log), ['what is the weather', null]); // not the greeting
  log.latency(record({ eot_to_first_audio_ms: 500 }));
  log.agent('Sunny.');
  assert.deepEqual(pair(log), ['what is the weather', 'Sunny.']);
  log.user('and tomorrow?');
  assert.deepEqual(pair(log), ['and tomorrow?', null]); // not "Sunny."
  log.agent('Rain.');
  assert.deepEqual(pair(log), ['and tomorrow?', 'Rain.']);
});

test('the latest exchange over LiveKit: a record that overtakes its words opens nothing yet', () => {
  const log = new TurnLog();
  log.user('one');
  log.agent('first answer');
  log.latency(record({ eot_to_first_audio_ms: 400 })); // turn 2's record, before its words
  assert.deepEqual(pair(log), ['one', 'first answer']);
  log.user('two');
  assert.deepEqual(pair(log), ['two', null]);
  log.agent('second answer');
  assert.deepEqual(pair(log), ['two', 'second answer']);
});

test('babble is shown as demo-chat prints it: replacement and control characters as ·', () => {
  assert.equal(UNREADABLE, '·');
  assert.equal(readable('Sunny and warm.'), 'Sunny and warm.');
  assert.equal(readable('a\uFFFDb\u0001c\u007Fd\u0085e'), 'a·b·c·d·e');
  assert.equal(readable('tab\there\r\nnext'), 'tab·here·\nnext'); // only \n stays
  assert.equal(readable('nb\u00A0sp zw\u200Bj bom\uFEFF'), 'nb·sp zw·j bom·');
  assert.equal(readable('lone \uD800 \uDC00 pair \uD83D\uDE00'), 'lone · · pair \uD83D\uDE00');
  assert.equal(readable('ls\u2028ps\u2029pua\uE000'), 'ls·ps·pua·');
  assert.equal(readable('héllo wörld 你好 ½ ∑'), 'héllo wörld 你好 ½ ∑');
  assert.equal(readable(''), '');
});
