"""Minimal REST call to the model, used by the quick start (the full client lives in `client/`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def predict(url: str, model: str, token: str | None, image: bytes, timeout: float = 30.0) -> dict:
    """POST raw image bytes to /predictions/<model>; returns the JSON answer (error answers too)."""
    request = urllib.request.Request(f"{url}/predictions/{model}", data=image, method="POST",
                                     headers={"Content-Type": "application/octet-stream",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return {"status": exc.code, **json.loads(body)}
        except ValueError:
            return {"status": exc.code, "error": body.decode(errors="replace")}
