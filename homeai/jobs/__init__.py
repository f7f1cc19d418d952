"""homeai.jobs package."""
