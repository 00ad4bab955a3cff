import assert from 'node:assert/strict';
import { test } from 'node:test';

import { floatToS16, Framer, peakS16, PlayoutClock, s16ToFloat } from '../src/pcm.js';

test('float <-> s16 round trip, clipped at full scale', () => {
  const s16 = floatToS16(new Float32Array([0, 0.5, -0.5, 1, -1, 2, -3]));
  assert.deepEqual([...s16], [0, 16384, -16384, 32767, -32768, 32767, -32768]);
  const back = s16ToFloat(s16.buffer);
  assert.equal(back.length, 7);
  assert.ok(Math.abs(back[1] - 0.5) < 1e-4 && back[4] === -1);
});

test('s16ToFloat ignores a trailing odd byte', () => {
  assert.equal(s16ToFloat(new Uint8Array(5).buffer).length, 2);
});

test('peak of a frame tells speech from silence', () => {
  assert.equal(peakS16(new Int16Array(960).buffer), 0);
  assert.equal(peakS16(new Int16Array([3, -1200, 400]).buffer), 1200);
});

test('Framer makes whole 20 ms frames from 128-sample worklet blocks', () => {
  const f = new Framer(960); // 20 ms at 48 kHz
  const block = new Float32Array(128).fill(0.25);
  let frames = [];
  for (let i = 0; i < 7; i += 1) frames = frames.concat(f.push(block)); // 896 samples
  assert.equal(frames.length, 0);
  frames = f.push(block); // 1024: one frame, 64 left over
  assert.equal(frames.length, 1);
  assert.equal(frames[0].length, 960);
  assert.equal(frames[0][0], Math.round(0.25 * 32767));
  assert.equal(f.fill, 64);
  assert.equal(f.push(new Float32Array(960 * 2)).length, 2); // a big push: several frames
});

test('PlayoutClock lays chunks end to end after a lead, restarts after an underrun', () => {
  const c = new PlayoutClock(0.08);
  assert.equal(c.schedule(10, 0.02), 10.08);
  assert.ok(Math.abs(c.schedule(10.001, 0.02) - 10.1) < 1e-9);
  assert.ok(Math.abs(c.buffered(10.05) - 0.07) < 1e-9);
  assert.equal(c.underruns, 0);
  // the network was late: the queue ran dry at 10.12, the next chunk comes at 10.5
  assert.equal(c.schedule(10.5, 0.02), 10.58);
  assert.equal(c.underruns, 1);
  c.reset(); // barge-in: the next reply starts fresh, not counted as an underrun
  assert.equal(c.schedule(11, 0.02), 11.08);
  assert.equal(c.underruns, 1);
});
