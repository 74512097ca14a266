"""Proposers: turn a profiled region into candidates. :mod:`.search` (offline, always available) and
:mod:`.llm` (the anthropic SDK, recorded and replayable)."""
