"""homeai.sched package."""
