"""Who gets in: open and speaking streams against the engine's real-time capacity
(`admission`), and the models it keeps of the engine and the front (`capacity`)."""
