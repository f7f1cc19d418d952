"""Wyoming speech to text for Home Assistant: `framing` reads and writes events, `session` speaks
the protocol on one connection, `server` listens and decides who may connect."""
