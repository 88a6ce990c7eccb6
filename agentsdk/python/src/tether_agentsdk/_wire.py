"""The protobuf JSON mapping of the few well-known types the API uses."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_TS = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$")


def duration(value: float | timedelta) -> str:
    """A google.protobuf.Duration in JSON: seconds with an "s", e.g. "1.5s"."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds != seconds or abs(seconds) > 315_576_000_000:
        raise ValueError("duration out of range")
    text = f"{seconds:.9f}".rstrip("0").rstrip(".")
    return (text or "0") + "s"


def parse_duration(text: str | None) -> timedelta | None:
    if not text:
        return None
    if not text.endswith("s"):
        raise ValueError(f"not a protobuf JSON duration: {text!r}")
    return timedelta(seconds=float(text[:-1]))


def timestamp(when: datetime) -> str:
    """A google.protobuf.Timestamp in JSON (RFC 3339, UTC)."""
    if when.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: str | None) -> datetime | None:
    """Parses RFC 3339 with up to nanoseconds (kept to microseconds);
    Python 3.10's fromisoformat takes neither "Z" nor nine digits."""
    if not text:
        return None
    m = _TS.match(text)
    if not m:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micro = int((m.group(7) or "0").ljust(9, "0")[:6])
    zone = m.group(8)
    if zone in ("Z", "z"):
        tz = timezone.utc
    else:
        sign = 1 if zone[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).astimezone(timezone.utc)


def uint64(value: object) -> int:
    """64-bit integers arrive as strings in protobuf JSON."""
    if value is None or value == "":
        return 0
    return int(value)  # type: ignore[arg-type]


_SURROGATE = re.compile("[\ud800-\udfff]")


def text(value: str) -> str:
    """A protobuf string from free text: a lone surrogate (what a JSON
    "\\udcff" or an undecodable file name decodes to) is not UTF-8, and the
    control plane refuses a message that holds one, so each becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", value)
