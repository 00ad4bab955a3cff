// PCM helpers of the WebSocket transport, pure (no DOM, no Web Audio): float <-> s16le,
// re-framing the mic into fixed frames, loudness of a frame, and the playout clock of
// the jitter buffer. Unit-tested under node (web/test/pcm.test.js).

/** Float samples in [-1, 1] -> Int16Array (clipped). */
export function floatToS16(f32) {
  const out = new Int16Array(f32.length);
  for (let i = 0; i < f32.length; i += 1) {
    const v = Math.max(-1, Math.min(1, f32[i]));
    out[i] = v < 0 ? Math.round(v * 32768) : Math.round(v * 32767);
  }
  return out;
}

/** s16le bytes (ArrayBuffer) -> Float32Array in [-1, 1). */
export function s16ToFloat(buf) {
  const s16 = new Int16Array(buf, 0, buf.byteLength >> 1);
  const out = new Float32Array(s16.length);
  for (let i = 0; i < s16.length; i += 1) out[i] = s16[i] / 32768;
  return out;
}

/** Peak absolute sample of s16 PCM (0..32768): how the page tells speech from silence. */
export function peakS16(buf) {
  const s16 = new Int16Array(buf, 0, buf.byteLength >> 1);
  let peak = 0;
  for (let i = 0; i < s16.length; i += 1) peak = Math.max(peak, Math.abs(s16[i]));
  return peak;
}

/** Collects the worklet's 128-sample blocks into frames of `size` samples (s16). */
export class Framer {
  constructor(size) {
    this.size = size;
    this.buf = new Float32Array(size);
    this.fill = 0;
  }

  /** Push float samples; returns the complete frames (Int16Array each). */
  push(f32) {
    const frames = [];
    let i = 0;
    while (i < f32.length) {
      const take = Math.min(this.size - this.fill, f32.length - i);
      this.buf.set(f32.subarray(i, i + take), this.fill);
      this.fill += take;
      i += take;
      if (this.fill === this.size) {
        frames.push(floatToS16(this.buf));
        this.fill = 0;
      }
    }
    return frames;
  }
}

/**
 * When each received chunk should start playing. Chunks are laid end to end; when the
 * queue ran dry (late network, or the start of a reply) playback restarts `lead` seconds
 * after now, which is the jitter buffer: small enough to keep latency low, big enough to
 * ride out a late frame or two.
 */
export class PlayoutClock {
  constructor(lead = 0.08) {
    this.lead = lead;
    this.next = 0;
    this.underruns = 0;
  }

  /** Start time (seconds on the audio clock) of a chunk of `duration` s arriving at `now`. */
  schedule(now, duration) {
    if (this.next < now) {
      if (this.next > 0) this.underruns += 1;
      this.next = now + this.lead;
    }
    const at = this.next;
    this.next += duration;
    return at;
  }

  /** Seconds queued ahead of `now`. */
  buffered(now) {
    return Math.max(0, this.next - now);
  }

  /** Barge-in: forget the queue (the caller stops the scheduled sources). */
  reset() {
    this.next = 0;
  }
}
