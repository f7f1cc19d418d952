"""homeai.store package."""
