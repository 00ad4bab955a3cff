// Latency figures the agent publishes as data messages (topic "latency"), one JSON
// object per turn. The schema lives in services/token/README.md; every field is
// optional, unknown fields are ignored, and a malformed message is dropped (counted),
// never shown. Values are milliseconds.

export const LATENCY_TOPIC = 'latency';
export const LATENCY_FIELDS = ['eot_to_first_audio_ms', 'llm_ttft_ms', 'tts_ttfa_ms'];
const WINDOW = 50; // turns kept for the median

/** Parse one payload: {field: number} for the known, valid fields, or null. */
export function parseLatency(payload) {
  let msg;
  try {
    const text = typeof payload === 'string' ? payload : new TextDecoder().decode(payload);
    msg = JSON.parse(text);
  } catch {
    return null;
  }
  if (!msg || typeof msg !== 'object' || Array.isArray(msg)) return null;
  const out = {};
  for (const f of LATENCY_FIELDS) {
    const v = msg[f];
    if (typeof v === 'number' && Number.isFinite(v) && v >= 0 && v < 600000) out[f] = v;
  }
  return Object.keys(out).length ? out : null;
}

export class LatencyStats {
  constructor() {
    this.values = Object.fromEntries(LATENCY_FIELDS.map((f) => [f, []]));
    this.turns = 0;
    this.dropped = 0;
  }

  add(parsed) {
    if (!parsed) {
      this.dropped += 1;
      return false;
    }
    this.turns += 1;
    for (const [f, v] of Object.entries(parsed)) {
      const list = this.values[f];
      list.push(v);
      if (list.length > WINDOW) list.shift();
    }
    return true;
  }

  last(field) {
    const list = this.values[field];
    return list.length ? list[list.length - 1] : null;
  }

  median(field) {
    const list = [...this.values[field]].sort((a, b) => a - b);
    if (!list.length) return null;
    const mid = list.length >> 1;
    return list.length % 2 ? list[mid] : (list[mid - 1] + list[mid]) / 2;
  }
}

export function formatMs(v) {
  return v === null ? '–' : `${Math.round(v)} ms`;
}
