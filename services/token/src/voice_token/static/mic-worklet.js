// The microphone tap of the WebSocket transport: hands every 128-sample block of the
// first input channel to the page (web/src/agent_socket.js frames and sends it).
class MicTap extends AudioWorkletProcessor {
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (ch) this.port.postMessage(ch.slice(0));
    return true;
  }
}
registerProcessor('mic-tap', MicTap);
