"""Wyoming speech to text and text to speech for Home Assistant: `framing` reads and writes events,
`session` speaks the protocol on one connection (`synthesis` its text to speech, `info` what
`describe` answers), `server` listens and decides who may connect."""
