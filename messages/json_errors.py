"""What a JSON request's validation error tells its client, in the client's terms.

msgspec's JSON decoder reads an integer literal outside 64 bits as a float, so a field
that takes neither (a bool, a string) is refused with "got `float`" for a value the
client wrote as an integer. `validation_message` says "got `int`" there instead.
"""

from __future__ import annotations

import re

import msgspec

_PATH = re.compile(r" - at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def validation_message(exc: msgspec.ValidationError, data: bytes | str) -> str:
    """exc's message for the JSON document data, naming an integer refused as a float an integer."""
    message = str(exc)
    found = _PATH.search(message) if "got `float`" in message else None
    if found is None:
        return message
    try:
        value: object = msgspec.json.decode(data)  # (only on this error: a refused request)
    except (msgspec.MsgspecError, RecursionError):
        return message
    for key, index in _STEP.findall(found.group(1)):
        if key:
            value = value.get(key) if isinstance(value, dict) else None
        else:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return message.replace("got `float`", "got `int`", 1)
    return message
