"""The voice library's files (`voice_library`) and reference audio decoded and checked
(`reference_audio`)."""
