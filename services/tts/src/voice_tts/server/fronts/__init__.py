"""The protocol adapters over the call: gRPC (`service`), the HTTP port (`http`,
`http_guards`, OpenAI speech in `openai_speech`, the voice library's `voices_http`), the
speech WebSocket (`ws_speech`), and the JSON shapes of the last two (`json_schema`)."""
