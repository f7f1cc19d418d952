"""Speech in and out, both optional: `base` imports no speech library, `stt` needs faster-whisper and PyAV,
`tts` needs piper; `sentences` (an answer cut into speakable sentences) is pure."""
