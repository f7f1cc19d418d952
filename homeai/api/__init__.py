"""homeai.api package."""
