// The voice page: get a token from this service, join the LiveKit room, publish the
// microphone, play the agent, show the conversation state, each turn (what the agent
// heard, what it answered, the turn's latency; turns.js) and the agent's latency
// figures. Bundled with the LiveKit client by esbuild (web/build.sh); nothing is
// fetched from a CDN at run time. Without LiveKit (the server says data-transport=
// "websocket", LIVEKIT_URL empty) the same page talks to the agent's own WebSocket
// (agent_socket.js) and shows the same states, transcripts and latency.
//
// It never hangs: every step that waits on the network has a bound (the token fetch,
// room.connect raced against TOKEN_CONNECT_TIMEOUT_SECONDS, and the agent's answer once
// connected, TOKEN_AGENT_TIMEOUT_SECONDS), and its failure lands in a named state with a
// sentence saying what to check.

import {
  ConnectionError,
  ConnectionErrorReason,
  Room,
  RoomEvent,
  Track,
} from 'livekit-client';

import { AgentSocket } from './agent_socket.js';
import { formatMs, LATENCY_FIELDS, LATENCY_TOPIC, LatencyStats, parseLatency } from './latency.js';
import {
  conversationState, IN_CALL, micNotice, noAgentDetail, noAgentState, settleState, STATES,
} from './states.js';
import { keepsCall, pageState, voiceChoices, voicesUrl } from './talk.js';
import {
  eotToFirstAudioMs, liveKitTranscript, readable, TRANSCRIPTION_TOPIC, TurnLog, UNREADABLE,
} from './turns.js';

const $ = (id) => document.getElementById(id);
const connectTimeoutMs = Number(document.body.dataset.connectTimeoutMs) || 15000;
const agentTimeoutMs = Number(document.body.dataset.agentTimeoutMs) || 10000;
const transport = document.body.dataset.transport === 'websocket' ? 'websocket' : 'livekit';
const agentWsUrl = document.body.dataset.agentWsUrl || '';
const identity = `web-${[...crypto.getRandomValues(new Uint8Array(4))]
  .map((b) => b.toString(16).padStart(2, '0')).join('')}`;

let state = 'loading';
let room = null;
let socket = null; // AgentSocket, when transport is "websocket"
let attempt = 0; // bumps on every join/leave so late events of an old room are ignored
let where = ''; // the room name or the agent's URL of the current call, for messages
let agentTimer = null; // runs while "waiting": the bound for an agent to answer
let feedbackOn = false; // the agent's "ready" said it saves feedback (this call)
const latency = new LatencyStats();
const turns = new TurnLog();

function setState(next, detail = '') {
  const prev = state;
  state = next;
  watchForAgent(prev, next);
  const el = $('state');
  el.dataset.state = next;
  $('state-label').textContent = STATES[next] ?? next;
  $('state-detail').textContent = detail;
  const busy = ['token', 'connecting', 'reconnecting'].includes(next);
  const inCall = IN_CALL.has(next);
  $('join').disabled = busy || inCall;
  $('join').textContent = ['unreachable', 'refused', 'token-error', 'disconnected']
    .includes(next) ? 'Retry' : 'Join';
  $('leave').disabled = !(busy || inCall);
  $('mute').disabled = !inCall;
  $('voice').disabled = busy || inCall; // a call keeps the voice it started with
  refreshFeedback();
}

// Entering "waiting" starts the agent's bound; leaving it stops it. When it runs out
// while still waiting, the page says so ("no-agent") and what to check.
function watchForAgent(prev, next) {
  if (next === 'waiting' && prev === 'waiting') return;
  clearTimeout(agentTimer);
  agentTimer = null;
  if (next !== 'waiting') return;
  const my = attempt;
  agentTimer = setTimeout(() => {
    if (my !== attempt || noAgentState(state) === state) return;
    setState(noAgentState(state), noAgentDetail(transport, where, agentTimeoutMs));
  }, agentTimeoutMs);
}

function notice(text) {
  $('notice').textContent = text;
  $('notice').hidden = !text;
}

function withTimeout(promise, ms) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function fetchToken(roomName) {
  const res = await withTimeout(
    fetch('/api/token', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ room: roomName, identity }),
    }),
    10000,
  );
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || `HTTP ${res.status}`);
  return body;
}

function explainConnectError(err, url) {
  const where = `${url} did not answer`;
  if (err instanceof ConnectionError && err.reason === ConnectionErrorReason.NotAllowed) {
    return ['refused', `${url} rejected the token (${err.message}). Do LIVEKIT_API_KEY and ` +
      'LIVEKIT_API_SECRET match the LiveKit server?'];
  }
  const why = err?.message ? ` (${err.message})` : '';
  return ['unreachable', `${where}${why}. Is the LiveKit server running, and is LIVEKIT_URL ` +
    'reachable from this browser?'];
}

async function join(event) {
  event?.preventDefault();
  const my = ++attempt;
  const roomName = $('room').value.trim();
  notice('');
  where = transport === 'websocket' ? agentWsUrl : roomName;
  if (transport === 'websocket') {
    joinSocket(my);
    return;
  }
  setState('token', `room ${roomName}`);
  let tok;
  try {
    tok = await fetchToken(roomName);
  } catch (err) {
    if (my === attempt) setState('token-error', err.message);
    return;
  }
  if (my !== attempt) return;
  setState('connecting', tok.server_url);
  room = new Room({ adaptiveStream: true, dynacast: true });
  wireRoom(room, my);
  try {
    // maxRetries 0: a refused connection is reported at once, not after a retry loop.
    await withTimeout(
      room.connect(tok.server_url, tok.participant_token, {
        maxRetries: 0, websocketTimeout: connectTimeoutMs,
      }),
      connectTimeoutMs,
    );
  } catch (err) {
    if (my !== attempt) return;
    const failed = room;
    room = null;
    failed.disconnect().catch(() => {});
    setState(...explainConnectError(err, tok.server_url));
    return;
  }
  if (my !== attempt) return;
  refreshConversation();
  try {
    await room.localParticipant.setMicrophoneEnabled(true);
  } catch (err) {
    notice(micNotice(err, window.isSecureContext));
  }
  refreshMute();
}

async function joinSocket(my) {
  feedbackOn = false;
  feedbackNote('');
  setState('connecting', agentWsUrl);
  const voice = $('voice-label').hidden ? '' : $('voice').value;
  const s = new AgentSocket(agentWsUrl, {
    onOpen: (micError) => {
      if (my !== attempt) return;
      // the socket is open; the agent answers with "ready" (then its states)
      setState('waiting', `connected to ${agentWsUrl}`);
      if (micError) notice(micNotice(micError, window.isSecureContext));
      refreshMute();
    },
    onEvent: (ev) => my === attempt && onAgentEvent(ev),
    onEnd: ([next, detail]) => {
      if (my !== attempt) return;
      socket = null;
      setState(next, detail);
      refreshMute();
    },
  }, voice);
  socket = s;
  window.voiceDemo.socket = s;
  await s.start(connectTimeoutMs);
}

function onAgentEvent(ev) {
  if (ev.type === 'state' && IN_CALL.has(state)) setState(pageState(ev.state));
  else if (ev.type === 'ready') onReady(ev);
  else if (ev.type === 'caption') onCaption(ev.delta);
  else if (ev.type === 'transcript') onTranscript(ev.role, ev.text, !!ev.interrupted);
  else if (ev.type === 'latency') onData(JSON.stringify(ev), LATENCY_TOPIC);
  else if (ev.type === 'feedback_saved') onFeedbackSaved(ev);
  else if (keepsCall(ev)) feedbackNote(`Not saved: ${ev.message}`, 'error');
}

function onReady(ev) {
  feedbackOn = ev.feedback === true;
  if (['waiting', 'no-agent'].includes(state)) setState('listening');
  else refreshFeedback();
}

// "You cut me off" / "Too slow": shown in a call whose agent saves feedback; each click
// sends the verdict on the agent's latest end of turn, and the agent's answer shows.
function refreshFeedback() {
  $('feedback').hidden = !(feedbackOn && socket && IN_CALL.has(state));
}

function sendFeedback(label) {
  if (!socket) return;
  socket.feedback(label);
  feedbackNote('Saving…');
}

function onFeedbackSaved(ev) {
  const button = [...$('feedback').querySelectorAll('button')]
    .find((el) => el.dataset.label === ev.label);
  feedbackNote(`Saved “${button?.textContent ?? ev.label}”. Thank you!`, 'saved', ev.id);
}

function feedbackNote(text, kind = '', title = '') {
  const note = $('feedback-note');
  note.textContent = text;
  note.dataset.kind = kind;
  note.title = title; // the saved pair's id on the agent's host
}

// The reply's words while it is spoken (the agent sends them as their audio plays); its
// transcript replaces them when it ends.
let caption = '';

function onCaption(delta) {
  caption += delta;
  showText($('agent-text'), caption);
  $('agent-text').dataset.live = 'true';
}

function onTranscript(role, text, interrupted = false) {
  caption = '';
  delete $('agent-text').dataset.live;
  $('transcript').dataset.count = String(Number($('transcript').dataset.count || 0) + 1);
  if (role === 'user') turns.user(text);
  else turns.agent(text, interrupted);
  renderTurns();
}

// "Conversation (latest)": the question and the answer of one turn (the newest with
// words), so a new question never stands next to the previous answer.
function renderLatest() {
  const t = turns.latest();
  showText($('user-text'), t?.user ?? null);
  showText($('agent-text'), t?.agent == null ? null : answerText(t.agent, t.interrupted));
}

// Text as demo-chat prints it (readable: babble's replacement and control characters as
// UNREADABLE); "–" for none. A line with babble says what the dots are, and so does the
// page's note.
function showText(el, text) {
  const shown = text === null ? '–' : readable(text);
  el.textContent = shown;
  el.title = text !== null && shown !== text ? BABBLE : '';
  if (el.title) $('babble-note').hidden = false;
}

const BABBLE = `${UNREADABLE} = bytes that are no text: random weights babble`;

function wireRoom(r, my) {
  const live = () => my === attempt && room === r;
  const refresh = () => live() && IN_CALL.has(state) && refreshConversation();
  r.on(RoomEvent.ParticipantConnected, refresh)
    .on(RoomEvent.ParticipantDisconnected, refresh)
    .on(RoomEvent.ParticipantAttributesChanged, refresh)
    .on(RoomEvent.ActiveSpeakersChanged, refresh)
    .on(RoomEvent.TrackSubscribed, (track) => {
      if (track.kind === Track.Kind.Audio) $('audio').appendChild(track.attach());
      refresh();
    })
    .on(RoomEvent.TrackUnsubscribed, (track) => track.detach().forEach((el) => el.remove()))
    .on(RoomEvent.AudioPlaybackStatusChanged, () => {
      $('enable-audio').hidden = r.canPlaybackAudio;
    })
    .on(RoomEvent.DataReceived, (payload, _participant, _kind, topic) => onData(payload, topic))
    .on(RoomEvent.Reconnecting, () => {
      if (live()) setState('reconnecting', 'The connection dropped; LiveKit is retrying.');
    })
    .on(RoomEvent.Reconnected, () => live() && refreshConversation())
    .on(RoomEvent.Disconnected, (reason) => {
      if (!live() || !(IN_CALL.has(state) || state === 'reconnecting')) return;
      room = null;
      setState('disconnected', reason ? `reason: ${reason}` : 'the connection ended');
    });
  // livekit-agents sends both sides' words as text streams; a final one is a transcript
  r.registerTextStreamHandler(TRANSCRIPTION_TOPIC, async (reader, from) => {
    let text;
    try {
      text = await reader.readAll();
    } catch {
      return; // a stream the agent aborted: nothing final to show
    }
    const t = liveKitTranscript({
      attributes: reader.info.attributes, sender: from.identity,
      self: r.localParticipant.identity, text,
    });
    if (t && live()) onTranscript(t.role, t.text);
  });
}

function refreshConversation() {
  if (room) {
    const next = settleState(state, conversationState(room.remoteParticipants.values()));
    if (next !== state) setState(next);
  }
  refreshMute();
}

function refreshMute() {
  const muted = room ? !room.localParticipant.isMicrophoneEnabled : !!socket?.muted;
  $('mute').textContent = muted ? 'Unmute' : 'Mute';
  $('mute').setAttribute('aria-pressed', String(muted));
  $('state').dataset.muted = String(muted && IN_CALL.has(state));
}

async function toggleMute() {
  if (socket) {
    socket.muted = !socket.muted;
    refreshMute();
    return;
  }
  if (!room) return;
  const lp = room.localParticipant;
  try {
    await lp.setMicrophoneEnabled(!lp.isMicrophoneEnabled);
  } catch (err) {
    notice(`Microphone unavailable: ${err.message}`);
  }
  refreshMute();
}

async function leave() {
  attempt += 1;
  const r = room;
  const s = socket;
  room = null;
  socket = null;
  feedbackOn = false;
  setState('idle', transport === 'websocket' ? 'You left the conversation.' : 'You left the room.');
  refreshMute();
  s?.close();
  if (r) await r.disconnect();
}

function onData(payload, topic) {
  if (topic !== LATENCY_TOPIC) return false;
  const ok = onLatency(parseLatency(payload));
  if (!ok) console.warn('dropped a malformed latency message');
  renderLatency();
  return ok;
}

function onLatency(parsed) {
  if (!latency.add(parsed)) return false;
  turns.latency(parsed);
  renderTurns();
  return true;
}

function renderLatency() {
  $('latency').dataset.count = String(latency.turns);
  for (const f of LATENCY_FIELDS) {
    const row = document.querySelector(`[data-metric="${f}"]`);
    const n = latency.values[f].length;
    row.querySelector('.last').textContent = formatMs(latency.last(f));
    row.querySelector('.median').textContent = n ? `${formatMs(latency.median(f))}` : '–';
    row.title = n ? `median of the last ${n} turns` : '';
  }
}

// Newest first, rebuilt whole (at most MAX_TURNS items); text goes in as text, never HTML.
function renderTurns() {
  const list = $('turns');
  list.dataset.count = String(turns.count);
  renderLatest();
  list.replaceChildren(...turns.newestFirst().map((t) => {
    const li = document.createElement('li');
    li.className = 'turn';
    li.dataset.turn = String(t.n);
    const head = document.createElement('div');
    head.className = 'turn-head';
    const eot = eotToFirstAudioMs(t);
    const ms = span('turn-latency', eot === null ? '' : `${formatMs(eot)} to first audio`);
    ms.title = "from the end of your turn to the agent's first audio";
    head.append(span('turn-n', `Turn ${t.n}`), ms);
    li.append(head);
    if (t.user !== null) li.append(said('turn-user', 'You', t.user));
    if (t.agent !== null) {
      li.append(said('turn-agent', 'Agent', answerText(t.agent, t.interrupted)));
    }
    return li;
  }));
}

function answerText(text, interrupted) {
  return text + (interrupted ? ' …(interrupted)' : '');
}

function span(cls, text) {
  const el = document.createElement('span');
  el.className = cls;
  el.textContent = text;
  return el;
}

function said(cls, who, text) {
  const p = document.createElement('p');
  p.className = cls;
  const words = span('text', '');
  showText(words, text);
  p.append(span('who', who), ' ', words);
  return p;
}

// The agent's voices (GET /v1/voices next to its /v1/talk: the TTS's presets and voice
// library), for the call's voice; the agent's own voice is selected. No list (an older
// agent, the TTS down): no choice shown, and the call gets the agent's voice.
async function loadVoices() {
  let choices = null;
  try {
    const res = await withTimeout(fetch(voicesUrl(agentWsUrl)), 5000);
    choices = res.ok ? voiceChoices(await res.json()) : null;
  } catch {
    choices = null;
  }
  const select = $('voice');
  if (!choices || select.options.length) return;
  select.replaceChildren(...choices.voices.map((v) => new Option(v.label, v.name)));
  select.value = choices.selected;
  $('voice-label').hidden = false;
}

function init() {
  const params = new URLSearchParams(location.search);
  $('room').value = params.get('room') || 'voice-demo';
  $('transport').textContent = transport === 'websocket' ? `agent ${agentWsUrl}` : 'LiveKit';
  // no rooms without LiveKit: one conversation with the agent per Join
  if (transport === 'websocket') {
    $('room').closest('label').hidden = true;
    loadVoices();
  }
  $('identity').textContent = identity;
  $('join-form').addEventListener('submit', join);
  $('leave').addEventListener('click', leave);
  $('mute').addEventListener('click', toggleMute);
  for (const id of ['cut-off', 'too-slow']) {
    $(id).addEventListener('click', () => sendFeedback($(id).dataset.label));
  }
  $('enable-audio').addEventListener('click', async () => {
    await room?.startAudio();
    await socket?.ctx?.resume();
    $('enable-audio').hidden = true;
  });
  setState('idle', 'Press Join, then allow the microphone when the browser asks.');
}

// A small handle for the browser console and the page test: read the state, and feed a
// data message through the same path LiveKit's DataReceived uses.
window.voiceDemo = {
  state: () => state,
  identity,
  transport,
  socket: null, // the AgentSocket of the current call: .stats = received audio
  receiveData: (text, topic = LATENCY_TOPIC) => onData(new TextEncoder().encode(text), topic),
  latency,
  turns, // TurnLog: the list of turns shown
};

init();
