"""voice_llm: the thinker service (voice.llm.v1.Thinker) over vLLM or Transformers."""
