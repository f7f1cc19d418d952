"""homeai.engine package."""
