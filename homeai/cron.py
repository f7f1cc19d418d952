"""When a job runs: a schedule string from the config turned into an APScheduler trigger.

    "every 30m" / "every 6h" / "every 1d"   an interval (s, m, h or d)
    "0 3 * * *"                              a cron line (minute hour day month weekday)

Below both its readers: the config checks a schedule with it when loaded, the jobs service
(`homeai.jobs.service`) runs jobs by it.
"""

from __future__ import annotations

import re

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

_EVERY = re.compile(r"every\s+(\d+)\s*([smhd])", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_schedule(text: str) -> BaseTrigger:
    """The trigger for `text`; ValueError with what is wrong (config validation shows it)."""
    text = text.strip()
    every = _EVERY.fullmatch(text)
    if every:
        amount = int(every.group(1))
        if amount < 1:
            raise ValueError(f"must repeat at least every 1{every.group(2)}, got {text!r}")
        return IntervalTrigger(**{_UNITS[every.group(2).lower()]: amount})
    try:
        return CronTrigger.from_crontab(text)
    except ValueError as e:
        raise ValueError(f"must be 'every N[s|m|h|d]' or a cron line such as '0 3 * * *' ({e}), "
                         f"got {text!r}") from None
