// The page's WebSocket transport: the conversation goes straight to the agent's
// GET /v1/talk (no LiveKit; the local mesh). Mic: getUserMedia -> AudioWorklet
// (static/mic-worklet.js) -> 20 ms s16le frames at the AudioContext's rate. Agent: s16le
// frames at its output rate, each scheduled on the PlayoutClock (a small jitter buffer);
// a "clear" event (barge-in) stops everything scheduled at once. Protocol: talk.js
// (the agent's protocol.json).

import { Framer, peakS16, PlayoutClock, s16ToFloat } from './pcm.js';
import {
  CLOSE, endState, feedbackMessage, INPUT_RATES, keepsCall, parseEvent, startMessage,
  stopMessage,
} from './talk.js';

const AUDIBLE_PEAK = 300; // s16 peak above which a received frame counts as heard

export class AgentSocket {
  /**
   * @param {string} url  the agent's ws:// URL
   * @param {{onOpen: Function, onEvent: Function, onEnd: Function}} on  callbacks:
   *   onOpen(micError?), onEvent(event) for every agent event but "clear",
   *   onEnd([pageState, detail]) once, when the conversation is over
   * @param {string} voice  the agent's voice for this call ('' = the agent's default)
   */
  constructor(url, on, voice = '') {
    this.url = url;
    this.on = on;
    this.voice = voice;
    this.muted = false;
    this.clock = new PlayoutClock(0.08);
    this.sources = new Set();
    this.stats = { frames: 0, audible: 0, peak: 0, clears: 0, sent: 0 };
    this.outRate = 24000;
    this.ended = false;
    this.opened = false;
    this.lastError = null;
  }

  async start(connectTimeoutMs) {
    this.ctx = new AudioContext();
    if (!INPUT_RATES.includes(this.ctx.sampleRate)) {
      await this.ctx.close();
      this.ctx = new AudioContext({ sampleRate: 48000 });
    }
    let micError = null;
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
      });
      await this.ctx.audioWorklet.addModule('/static/mic-worklet.js');
    } catch (err) {
      micError = err;
    }
    if (this.ended) return;
    const ws = new WebSocket(this.url);
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    const timer = setTimeout(() => {
      if (!this.opened) this.finish({ opened: false, timedOut: true });
    }, connectTimeoutMs);
    ws.onopen = () => {
      clearTimeout(timer);
      this.opened = true;
      ws.send(startMessage(this.ctx.sampleRate, this.voice));
      if (!micError) this.wireMic();
      this.on.onOpen(micError);
    };
    ws.onmessage = (m) => this.receive(m.data);
    ws.onclose = (e) => {
      clearTimeout(timer);
      this.finish({ opened: this.opened, code: e.code, error: this.lastError });
    };
  }

  wireMic() {
    const src = this.ctx.createMediaStreamSource(this.stream);
    const tap = new AudioWorkletNode(this.ctx, 'mic-tap');
    const framer = new Framer(Math.round(this.ctx.sampleRate / 50));
    tap.port.onmessage = (e) => {
      if (this.ws?.readyState !== WebSocket.OPEN) return;
      for (const frame of framer.push(e.data)) {
        if (this.muted) frame.fill(0); // keep the agent's clock running: silence, not nothing
        this.ws.send(frame.buffer);
        this.stats.sent += 1;
      }
    };
    // the tap must reach the destination to be pulled; a zero gain keeps it inaudible
    const mute = this.ctx.createGain();
    mute.gain.value = 0;
    src.connect(tap).connect(mute).connect(this.ctx.destination);
    this.nodes = [src, tap, mute];
  }

  receive(data) {
    if (data instanceof ArrayBuffer) {
      this.play(data);
      return;
    }
    const ev = parseEvent(data);
    if (!ev) return;
    if (ev.type === 'ready') this.outRate = ev.output_rate;
    if (ev.type === 'error' && !keepsCall(ev)) this.lastError = ev; // why the call ended
    if (ev.type === 'clear') {
      this.stats.clears += 1;
      this.flush();
      return;
    }
    this.on.onEvent(ev);
  }

  play(buf) {
    const peak = peakS16(buf);
    this.stats.frames += 1;
    this.stats.peak = Math.max(this.stats.peak, peak);
    if (peak > AUDIBLE_PEAK) this.stats.audible += 1;
    const samples = s16ToFloat(buf);
    if (!samples.length) return;
    const ab = this.ctx.createBuffer(1, samples.length, this.outRate);
    ab.copyToChannel(samples, 0);
    const node = this.ctx.createBufferSource();
    node.buffer = ab;
    node.connect(this.ctx.destination);
    node.onended = () => this.sources.delete(node);
    this.sources.add(node);
    node.start(this.clock.schedule(this.ctx.currentTime, ab.duration));
  }

  /** The user's verdict on the latest end of turn ('cut_off', 'too_slow'). */
  feedback(label) {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(feedbackMessage(label));
  }

  /** Barge-in: silence now, drop everything scheduled. */
  flush() {
    for (const node of this.sources) {
      try {
        node.stop();
      } catch {
        // not started yet on some engines: disconnecting is enough
      }
      node.disconnect();
    }
    this.sources.clear();
    this.clock.reset();
  }

  close() {
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) {
      this.ws.send(stopMessage());
      this.ws.close(CLOSE.normal);
    }
    this.finish(null);
  }

  finish(why) {
    if (this.ended) return;
    this.ended = true;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(CLOSE.normal);
    this.flush();
    for (const n of this.nodes ?? []) n.disconnect();
    for (const t of this.stream?.getTracks() ?? []) t.stop();
    this.ctx?.close().catch(() => {});
    if (why) {
      const [state, detail] = endState(this.url, why);
      this.on.onEnd([state, why.timedOut ? `${detail} (no answer in time)` : detail]);
    }
  }
}
