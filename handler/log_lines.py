"""The log line each refused request leaves, written by whichever process refused it (the TorchServe handler, the
gateway, the python runtime), so an operator greps one shape in the pod's log."""

from __future__ import annotations

import json


def refusal_log_line(request: str | None, status: int, body: bytes | str) -> str:
    """``refused request <id>: <status> <reason>``: the reason is what the client was told (the JSON body's
    ``error``, or TorchServe's ``message``), on one line and at most 200 characters; client-named fields in it are
    ascii()-escaped where the message is made, and request bodies never reach it."""
    try:
        answer = json.loads(body)
        reason = str(answer.get("error") or answer.get("message") or "") if isinstance(answer, dict) else ""
    except (ValueError, UnicodeDecodeError):
        reason = ""
    return f"refused request {request or '-'}: {status} {' '.join(reason.split())[:200]}".rstrip()
