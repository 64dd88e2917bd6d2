"""A corpus of hostile and unusual requests for /predictions/<model>, generated in memory.

Every item is either **must-reject** (a 4xx JSON error that names the problem, never a 5xx) or
**must-accept** (a legitimate image sent in an unusual way: answered 200, exactly as the offline
service answers the same image). Test ids carry the class: ``reject-…`` / ``accept-…``.

Decisions recorded here (and in SECURITY.md):
- 1x1 and 1x10000 images, 16-bit PNG, CMYK JPEG and animated GIF (first frame) are legitimate: 200.
- A PNG whose IDAT CRC alone is wrong decodes to intact pixels (Pillow checks header-chunk CRCs and
  zlib's own checksum protects the data): accepted. A bad IHDR CRC or corrupted IDAT data: 400.
- Content types: TorchServe's frontend passes the body unchanged to the handler for every type except
  ``application/x-www-form-urlencoded`` and ``multipart/form-data; boundary=…``, which it parses as forms.
  The worker turns ``application/json`` bodies into objects and ``text/*`` bodies into str when they are
  UTF-8; image bytes are never UTF-8, so ``text/plain`` + PNG reaches the handler as bytes: accepted.
  A URL-encoded body (curl -d and --data-binary without -H) never reaches TorchServe's form decoder as it is
  sent unless it is a form: the front before it (serving.front locally, the gateway in the container) passes
  image bytes on as application/octet-stream (accepted, whether or not Netty's decoder could have read them, see
  form_decoder_fails) and refuses a form that does not decode with 400 (serving.forms). An ASCII body that is
  a form reaches the handler as form fields, and the handler names the header that sends image bytes or JSON.
  Requests whose error message would carry non-ASCII text (field names, content types) currently kill the
  worker (see test_faults.py), so they are not sent to the shared server.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import re
import socket
import struct
import time
import urllib.request
import uuid
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
from PIL import Image, ImageDraw

from settings import MAX_IMAGE_PIXELS, max_request_size

Expect = Literal["reject", "accept"]
OCTET = {"Content-Type": "application/octet-stream"}
JSON = {"Content-Type": "application/json"}

MAX_REQUEST_SIZE = max_request_size()


@dataclass(frozen=True)
class HostileRequest:
    """One request of the corpus and what the server must answer."""

    name: str
    expect: Expect
    body: bytes
    headers: dict[str, str]
    status: int
    fragment: str = ""  # lower-case text the JSON error must contain (must-reject items)
    image: bytes | None = None  # must-accept: the image bytes the handler decodes (offline reference)
    raw_socket: bool = False  # the frontend answers before reading the body: send headers + a little

    @property
    def id(self) -> str:
        return f"{self.expect}-{self.name}"


@dataclass
class Assets:
    """Legitimate pictures the corpus is built from (a real MNIST digit drawn as a user would send it)."""

    digit: np.ndarray  # 28x28 uint8 MNIST canvas, light on black
    other: np.ndarray  # another digit, for the second frame of the GIF
    cache: dict[str, bytes] = field(default_factory=dict)

    def picture(self, scale: int = 3, mode: str = "L") -> Image.Image:
        img = Image.fromarray(255 - self.digit).resize((28 * scale, 28 * scale), Image.Resampling.BICUBIC)
        return img.convert(mode)

    def png(self) -> bytes:
        return self.cache.setdefault("png", encode(self.picture()))

    def jpeg(self) -> bytes:
        return self.cache.setdefault("jpeg", encode(self.picture(), "JPEG", quality=90))


def encode(img: Image.Image, fmt: str = "PNG", **params) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def png_chunks(png: bytes) -> list[tuple[int, bytes, bytes]]:
    """(offset, type, data) of every chunk of a PNG."""
    out, pos = [], 8
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        out.append((pos, png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return out


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def with_bad_crc(png: bytes, kind: bytes) -> bytes:
    """The PNG with the CRC of its first `kind` chunk inverted (data untouched)."""
    pos, _, data = next(c for c in png_chunks(png) if c[1] == kind)
    end = pos + 8 + len(data)
    crc = struct.unpack(">I", png[end : end + 4])[0] ^ 0xFFFFFFFF
    return png[:end] + struct.pack(">I", crc) + png[end + 4 :]


def with_corrupt_idat(png: bytes) -> bytes:
    """The PNG with bytes inside its compressed IDAT data overwritten and the CRC recomputed."""
    pos, _, data = next(c for c in png_chunks(png) if c[1] == b"IDAT")
    broken = bytearray(data)
    broken[2 : len(broken) // 2] = b"\xff" * (len(broken) // 2 - 2)
    return png[:pos] + png_chunk(b"IDAT", bytes(broken)) + png[pos + 12 + len(data) :]


def png_bomb(width: int, height: int) -> bytes:
    """A genuine 1-bit PNG of width x height zeros: ~100 KB on the wire, width*height pixels decoded."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    row = b"\0" * (1 + (width + 7) // 8)
    comp = zlib.compressobj(9)
    rows_per_chunk = max(1, (1 << 20) // len(row))
    parts, done = [], 0
    while done < height:
        n = min(rows_per_chunk, height - done)
        parts.append(comp.compress(row * n))
        done += n
    parts.append(comp.flush())
    idat = png_chunk(b"IDAT", b"".join(parts))
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + idat + png_chunk(b"IEND", b"")


def png_claiming(width: int, height: int) -> bytes:
    """A 4x4 PNG whose IHDR claims width x height (valid CRC), with its 4x4 pixel data."""
    small = encode(Image.new("L", (4, 4), 0))
    pos, _, data = png_chunks(small)[0]
    ihdr = struct.pack(">II", width, height) + data[8:]
    return small[:pos] + png_chunk(b"IHDR", ihdr) + small[pos + 12 + len(data) :]


def jpeg_claiming(jpeg: bytes, width: int, height: int) -> bytes:
    """The JPEG with its SOF0 frame header patched to claim width x height."""
    sof = jpeg.index(b"\xff\xc0")
    return jpeg[: sof + 5] + struct.pack(">HH", height, width) + jpeg[sof + 9 :]


def gif_claiming(width: int, height: int) -> bytes:
    gif = bytearray(encode(Image.new("P", (4, 4), 0), "GIF"))
    gif[6:10] = struct.pack("<HH", width, height)
    return bytes(gif)


def tiff_claiming(width: int, height: int) -> bytes:
    """A little-endian TIFF whose ImageWidth/ImageLength tags claim width x height."""
    tiff = bytearray(encode(Image.new("L", (4, 4), 0), "TIFF"))
    (ifd,) = struct.unpack("<I", tiff[4:8])
    (count,) = struct.unpack("<H", tiff[ifd : ifd + 2])
    for i in range(count):
        entry = ifd + 2 + 12 * i
        tag, kind = struct.unpack("<HH", tiff[entry : entry + 4])
        if tag in (256, 257):
            value = width if tag == 256 else height
            tiff[entry + 2 : entry + 12] = struct.pack("<HII", 4, 1, value)  # LONG, count 1
    return bytes(tiff)


def multipart(parts: list[tuple[str, str | None, str | None, bytes]]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body from (field, filename or None, part content type or None, data)."""
    boundary = uuid.uuid4().hex
    body = b""
    for name, filename, ctype, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if ctype:
            head += f"Content-Type: {ctype}\r\n"
        body += head.encode() + b"\r\n" + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


def b64_json(data: bytes, key: str = "data") -> bytes:
    return json.dumps({key: base64.b64encode(data).decode()}).encode()


def minimal_pdf() -> bytes:
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 28 28] >>"]
    body, offsets = b"%PDF-1.4\n", []
    for i, obj in enumerate(objects, 1):
        offsets.append(len(body))
        body += f"{i} 0 obj\n".encode() + obj + b"\nendobj\n"
    xref = len(body)
    body += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    body += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    return body + f"trailer << /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()


SVG = (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="28" height="28">'
       b'<path d="M6 6 H22 L10 24" stroke="white" stroke-width="3" fill="none"/></svg>\n')
HTML = b"<!doctype html><html><body><form><input type=file name=data></form><script>alert(1)</script></body></html>"
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 28\nnewpath 4 4 moveto 24 24 lineto stroke\nshowpage\n%%EOF\n"
#: A pickle that would run os.system("id") if anything unpickled request bodies.
PICKLE = (b"\x80\x04\x95\x1d\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94"
          b"\x8c\x02id\x94\x85\x94R\x94.")
ELF = b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 56


Payload = tuple[bytes, dict[str, str]]


@dataclass(frozen=True)
class Case:
    """A corpus entry whose body is built later, from the fixture's assets."""

    name: str
    expect: Expect
    status: int
    make: Callable[[Assets], Payload]
    fragment: str = ""
    image: Callable[[Assets], bytes] | None = None  # must-accept: the image the handler decodes (default: body)
    raw_socket: bool = False

    @property
    def id(self) -> str:
        return f"{self.expect}-{self.name}"

    def build(self, assets: Assets) -> HostileRequest:
        body, headers = self.make(assets)
        image = (self.image(assets) if self.image else body) if self.expect == "accept" else None
        return HostileRequest(self.name, self.expect, body, headers, self.status, self.fragment, image,
                              self.raw_socket)


def reject(name: str, status: int, fragment: str, make: Callable[[Assets], Payload], **kw) -> Case:
    return Case(name, "reject", status, make, fragment, **kw)


def accept(name: str, make: Callable[[Assets], Payload], image: Callable[[Assets], bytes] | None = None) -> Case:
    return Case(name, "accept", 200, make, image=image)


def octet(data: bytes) -> Payload:
    return data, OCTET


def typed(data: bytes, content_type: str) -> Payload:
    return data, {"Content-Type": content_type}


def animated_gif(a: Assets) -> bytes:
    frames = [a.picture(mode="P"),
              Image.fromarray(255 - a.other).resize((84, 84), Image.Resampling.BICUBIC).convert("P")]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def png16(a: Assets) -> bytes:
    levels = np.asarray(a.picture(), dtype=np.uint16) * 257  # the full 16-bit range
    return encode(Image.fromarray(levels.astype(np.uint16)))


def tall_line() -> bytes:
    column = np.full((10000, 1), 255, np.uint8)
    column[2000:8000] = 0
    return encode(Image.fromarray(column))


def at_pixel_limit() -> bytes:
    """A 1-bit 4000x4000 drawing: exactly max_image_pixels, the largest image the handler accepts."""
    img = Image.new("1", (4000, MAX_IMAGE_PIXELS // 4000), 1)
    ImageDraw.Draw(img).line([(800, 800), (3200, 800), (1600, 3300)], fill=0, width=300)
    return encode(img)


FORM = "application/x-www-form-urlencoded"
#: A "%" that is not a %XX escape.
BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def form_decoder_fails(body: bytes) -> bool:
    """A sure sign that TorchServe's form decoder (Netty's HttpPostStandardRequestDecoder) answers 500 to `body`: a
    bad %-escape in the field name before the first "=". Not the only one: of 240 encodings of ten digits sent as
    forms to TorchServe 0.12, the 15 with this sign and 97 others got 500, the other 128 reached the handler."""
    equals, bad = body.find(b"="), BAD_ESCAPE.search(body)
    return equals > 0 and bad is not None and bad.start() < equals and b"&" not in body[:equals]


def digit_png(a: Assets, test: Callable[[bytes], bool]) -> bytes:
    """The first PNG encoding of the digit (1-bit or grey, 28 to 84 px, any compression level) that passes `test`:
    bytes a URL-encoded form decoder reads as the case needs."""
    for mode in ("1", "L"):
        for scale in (1, 2, 3):
            for level in range(10):
                png = encode(a.picture(scale, mode), compress_level=level)
                if test(png):
                    return png
    raise AssertionError("no encoding of the digit fits the case: pick another picture")


def form_fields_png(a: Assets) -> bytes:
    """A PNG that the frontend's form decoder splits into fields: no "%" in it, and an "=" (a field has one)."""
    return digit_png(a, lambda png: b"%" not in png and b"=" in png)


def json_as_form(a: Assets, fields: bool) -> bytes:
    """{"data": base64 PNG}; its base64 ends in "=" padding when `fields` (the decoder makes a field of it), has no
    "=" otherwise (the decoder keeps nothing)."""
    return b64_json(digit_png(a, lambda png: (len(png) % 3 != 0) == fields))


CASES: list[Case] = [
    # --- not images at all ---
    reject("empty-body", 400, "empty", lambda a: octet(b"")),
    reject("one-byte", 400, "not an image", lambda a: octet(b"\x89")),
    reject("plain-text", 415, "not an image", lambda a: typed(b"hello, I am a seven\n", "text/plain")),
    reject("plain-text-as-octet-stream", 400, "not an image", lambda a: octet(b"hello, I am a seven\n")),
    reject("html", 415, "not an image", lambda a: typed(HTML, "text/html")),
    reject("html-as-octet-stream", 400, "not an image", lambda a: octet(HTML)),
    reject("svg", 400, "not an image", lambda a: typed(SVG, "image/svg+xml")),
    reject("pdf", 400, "not an image", lambda a: typed(minimal_pdf(), "application/pdf")),
    reject("eps-postscript", 400, "not an image", lambda a: typed(EPS, "application/postscript")),
    reject("zip-of-png", 400, "not an image", lambda a: typed(zip_of({"digit.png": a.png()}), "application/zip")),
    reject("zlib-of-png", 400, "not an image", lambda a: octet(zlib.compress(a.png()))),
    reject("pickle-payload", 400, "not an image", lambda a: octet(PICKLE)),
    reject("elf-binary", 400, "not an image", lambda a: octet(ELF)),
    reject("random-bytes", 400, "not an image", lambda a: octet(np.random.default_rng(7).bytes(4096))),
    # --- JSON ---
    reject("json-without-data", 400, '{"data"', lambda a: (b'{"image": "aGVsbG8="}', JSON)),
    reject("json-data-null", 400, '{"data"', lambda a: (b'{"data": null}', JSON)),
    reject("json-data-number", 400, '{"data"', lambda a: (b'{"data": 7}', JSON)),
    reject("json-data-empty", 400, "empty", lambda a: (b'{"data": ""}', JSON)),
    reject("json-list", 400, "unsupported request body", lambda a: (b"[1, 2, 3]", JSON)),
    reject("json-string", 415, "not an image", lambda a: (b'"aGVsbG8="', JSON)),
    reject("json-syntax-error", 400, "not valid json", lambda a: (b'{"data": "abc"', JSON)),
    reject("json-deep-nesting", 400, "not valid json", lambda a: (b"[" * 100_000 + b"]" * 100_000, JSON)),
    reject("json-invalid-utf8", 400, "not valid json", lambda a: (b'{"data": "\xff\xfe"}', JSON)),
    reject("json-invalid-base64", 400, "base64", lambda a: (b'{"data": "not base64!"}', JSON)),
    reject("json-base64-of-text", 400, "not an image", lambda a: (b64_json(b"just text"), JSON)),
    reject("json-base64-of-truncated-png", 400, "truncated", lambda a: (b64_json(a.png()[: len(a.png()) // 2]), JSON)),
    reject("png-bytes-declared-json", 400, "not valid json", lambda a: (a.png(), JSON)),
    # --- broken images ---
    reject("png-signature-only", 400, "not an image", lambda a: octet(a.png()[:8])),
    reject("png-truncated", 400, "truncated", lambda a: octet(a.png()[: len(a.png()) // 2])),
    reject("jpeg-truncated", 400, "truncated", lambda a: octet(a.jpeg()[: len(a.jpeg()) // 2])),
    reject("jpeg-soi-only", 400, "not an image", lambda a: octet(b"\xff\xd8\xff")),
    reject("png-bad-ihdr-crc", 400, "not an image", lambda a: octet(with_bad_crc(a.png(), b"IHDR"))),
    reject("png-corrupt-idat-data", 400, "corrupt or truncated png", lambda a: octet(with_corrupt_idat(a.png()))),
    reject("png-zero-width", 400, "not an image", lambda a: octet(png_claiming(0, 28))),
    reject("gif-header-only", 400, "not an image", lambda a: octet(b"GIF89a")),
    # --- decompression bombs and pixel limits: 413 from the header, before decoding pixels ---
    reject("png-bomb-30000x30000", 413, "too large",
           lambda a: octet(a.cache.setdefault("bomb", png_bomb(30000, 30000)))),
    reject("png-header-claims-30000x30000", 413, "too large", lambda a: octet(png_claiming(30000, 30000))),
    reject("png-5000x5000-over-limit", 413, "25000000 pixels", lambda a: octet(png_claiming(5000, 5000))),
    reject("png-one-row-over-limit", 413, "16004000 pixels", lambda a: octet(png_claiming(4000, 4001))),
    reject("jpeg-header-claims-65500x65500", 413, "too large", lambda a: octet(jpeg_claiming(a.jpeg(), 65500, 65500))),
    reject("gif-header-claims-65535x65535", 413, "too large", lambda a: octet(gif_claiming(65535, 65535))),
    reject("tiff-header-claims-100000x100000", 413, "too large", lambda a: octet(tiff_claiming(100000, 100000))),
    reject("body-over-max-request-size", 413, "", lambda a: octet(b"\0" * (MAX_REQUEST_SIZE + 1)), raw_socket=True),
    # --- forms and content types ---
    reject("multipart-without-file", 400, "", lambda a: multipart([("note", None, None, b"a seven")])),
    reject("multipart-text-file", 400, "no image file field",
           lambda a: multipart([("comment", "seven.txt", "text/plain", b"seven")])),
    reject("multipart-text-data-not-base64", 400, "base64",
           lambda a: multipart([("data", "seven.txt", "text/plain", b"seven!")])),
    reject("multipart-empty-file", 400, "empty", lambda a: multipart([("data", "d.png", "image/png", b"")])),
    reject("multipart-two-files-no-data", 400, "several",
           lambda a: multipart([("front", "f.png", "image/png", a.png()), ("back", "b.png", "image/png", a.png())])),
    reject("multipart-boundary-mismatch", 400, "empty request",
           lambda a: typed(a.png(), "multipart/form-data; boundary=x")),
    reject("form-urlencoded-text-field", 400, "form has no image file field", lambda a: typed(b"digit=7", FORM)),
    reject("form-urlencoded-bad-escape", 400, "no %xx escape", lambda a: typed(b"data=%zz", FORM)),
    # curl -d / --data-binary without -H label the body a URL-encoded form
    reject("json-as-form-urlencoded", 400, "a json body arrived as a url-encoded form",
           lambda a: typed(json_as_form(a, fields=True), FORM)),
    reject("json-without-equals-as-form-urlencoded", 400, '-h "content-type: application/json"',
           lambda a: typed(json_as_form(a, fields=False), FORM)),
    accept("png-as-form-urlencoded", lambda a: typed(form_fields_png(a), FORM)),
    accept("png-failing-the-form-decoder", lambda a: typed(digit_png(a, form_decoder_fails), FORM)),
    # --- legitimate images sent in unusual ways: answered 200 like the offline service ---
    accept("png-16-bit", lambda a: typed(png16(a), "image/png")),
    accept("jpeg-cmyk", lambda a: typed(encode(a.picture(mode="CMYK"), "JPEG", quality=90), "image/jpeg")),
    accept("animated-gif-first-frame", lambda a: typed(animated_gif(a), "image/gif"),
           image=lambda a: encode(Image.open(io.BytesIO(animated_gif(a))).convert("L"))),
    accept("png-1x1", lambda a: octet(encode(Image.new("L", (1, 1), 255)))),
    accept("png-1x10000", lambda a: octet(tall_line())),
    accept("png-4000x4000-at-pixel-limit", lambda a: octet(at_pixel_limit())),
    accept("png-idat-bad-crc-intact-pixels", lambda a: octet(with_bad_crc(a.png(), b"IDAT"))),
    accept("png-with-trailing-garbage", lambda a: octet(a.png() + b"\0garbage" * 64)),
    accept("text-plain-with-png-bytes", lambda a: typed(a.png(), "text/plain")),
    accept("no-content-type", lambda a: (a.png(), {})),
    accept("multipart-without-boundary", lambda a: typed(a.png(), "multipart/form-data")),
    accept("multipart-file-declared-text", lambda a: multipart([("data", "d.png", "text/plain", a.png())]),
           image=lambda a: a.png()),
    accept("multipart-text-data-base64",  # KServe-style row {"data": "<base64>"}
           lambda a: multipart([("data", "d.b64", "text/plain", base64.b64encode(a.png()))]), image=lambda a: a.png()),
    accept("json-data-uri-wrapped-base64",
           lambda a: (json.dumps({"data": "data:image/png;base64," + base64.encodebytes(a.png()).decode()}).encode(),
                      JSON), image=lambda a: a.png()),
]
assert len({case.id for case in CASES}) == len(CASES), "corpus ids must be unique"


def build_corpus(assets: Assets) -> list[HostileRequest]:
    """Every case's request, built from real digits (nothing is read from disk)."""
    return [case.build(assets) for case in CASES]


# --- sending requests and watching the server ---------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What the server answered: HTTP status and the parsed JSON body (None when it was not JSON)."""

    status: int
    body: dict | list | None
    raw: bytes

    @property
    def from_handler(self) -> bool:
        """True when our handler wrote the answer (its bodies carry "status" or "pred"), not the frontend."""
        return isinstance(self.body, dict) and ("pred" in self.body or "status" in self.body)

    @property
    def message(self) -> str:
        if not isinstance(self.body, dict):
            return ""
        return str(self.body.get("error") or self.body.get("message") or "")


def _parse(status: int, raw: bytes) -> Outcome:
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError:
        body = None
    return Outcome(status, body, raw)


def post(url: str, body: bytes, headers: dict[str, str], token: str | None, timeout: float = 60.0) -> Outcome:
    """POST with http.client (no default Content-Type is added, unlike urllib)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        hdrs = {**headers, **({"Authorization": f"Bearer {token}"} if token else {})}
        conn.request("POST", parts.path, body=body, headers=hdrs)
        response = conn.getresponse()
        return _parse(response.status, response.read())
    finally:
        conn.close()


def post_oversized(url: str, headers: dict[str, str], token: str, length: int, timeout: float = 30.0) -> Outcome:
    """Announce a `length`-byte body, send 64 KiB of it, and read the answer the frontend sends early."""
    parts = urlsplit(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall((f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
                      f"{head}Content-Length: {length}\r\n\r\n").encode())
        try:
            sock.sendall(b"\0" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the frontend may already have answered and closed
        reader = sock.makefile("rb")
        status = int(reader.readline().split()[1])
        size = 0
        while (line := reader.readline().strip()):
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                size = int(value)
        return _parse(status, reader.read(size) if size else b"")


def send(url: str, token: str, item: HostileRequest) -> Outcome:
    if item.raw_socket:
        return post_oversized(url, item.headers, token, len(item.body))
    return post(url, item.body, item.headers, token)


def worker_pids(management_url: str, model: str, token: str) -> dict[str, int]:
    """Worker id -> pid of the model's READY workers, from the management API's describe call."""
    request = urllib.request.Request(f"{management_url}/models/{model}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        described = json.loads(response.read())
    return {w["id"]: int(w["pid"]) for version in described for w in version["workers"] if w["status"] == "READY"}


def ready_pids(instance) -> dict[str, int]:
    """READY workers of a serving.server.Instance's model (id -> pid)."""
    return worker_pids(instance.endpoints.management, instance.model_name, instance.keys()["management"])


def wait_for_workers(instance, count: int, gone: frozenset[int] = frozenset(), timeout: float = 90.0) -> float:
    """Seconds until `count` workers are READY and none of them has a pid in `gone`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            pids = ready_pids(instance)
        except OSError:
            pids = {}
        if len(pids) >= count and not gone & set(pids.values()):
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{count} READY workers not back after {timeout:.0f}s")
