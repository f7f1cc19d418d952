"""homeai: a home AI server that keeps one llama.cpp model responsive for a whole household."""

from homeai import threads  # noqa: F401 (first: the OpenMP wait policy, before any runtime loads)

__version__ = "0.1.0"
