"""homeai.speech package."""
