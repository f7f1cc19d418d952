"""Speech to text, which is optional: `base` imports no speech library, `stt` needs faster-whisper and PyAV."""
