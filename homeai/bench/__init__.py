"""homeai.bench package."""
