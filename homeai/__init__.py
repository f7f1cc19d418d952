"""homeai: a home AI server that keeps one llama.cpp model responsive for a whole household."""

__version__ = "0.1.0"
