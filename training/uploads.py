"""The uploads exam: real images that are not digits, as a user might send them to the digit model by mistake.

Every item is an encoded file (PNG or JPEG bytes, at the size it would be uploaded), so it goes through the served
decoding and the model's preprocessing profile like a request. Made from what Debian packages and the Python
packages in the lock ship, never from anything training reads (training/negatives.py says what it reads; a test
checks both lists):

========================  ================================================================================
category                  source
========================  ================================================================================
icons                     full-colour icons of the Adwaita and hicolor themes (/usr/share/icons), as the files
                          are, or flattened onto a window background like a screenshot
symbolic-icons            Adwaita's one-colour ``*-symbolic`` toolbar icons, as files or as screenshots
ui-glyphs                 Glyphicons Halflings and Font Awesome 4 pictograms, as toolbar buttons
emoji                     Noto Color Emoji (Debian fonts-noto-color-emoji)
charts                    matplotlib figures (line, bar, scatter, pie, histogram, heatmap, box plot)
documents                 paragraphs of text in Liberation and FreeFont faces, as screenshots and scans
photos                    scikit-learn's two sample photos, matplotlib's sample photos and MRI slice, crops
textures                  close crops of those photos and of matplotlib's terrain elevation models, shaded
scene-crops               crops of 4-25% of those photos and elevation models at phone-photo sizes: an edge,
                          a petal, a sleeve, the scale where a photo path can take an edge or a blob for a digit
generated-textures        wood, marble, woven cloth, brick, gravel, cloud and grass made here (numpy), tinted,
                          lit unevenly and photographed (noise, JPEG)
qr-codes                  QR and Micro QR codes made with segno
letters                   single letters no digit resembles (:data:`DIGIT_LIKE` left out), Liberation/FreeFont
words                     English words in Liberation and FreeFont faces
========================  ================================================================================

``python -m training eval --ood uploads`` reports the share flagged ``unknown`` overall and per category
(docs/non-digits.md). Generation is deterministic for a seed and takes a few seconds. One module (about 440 lines)
on purpose: thirteen short builders side by side with the sources they read and the registry that lists them, so
that what the exam holds, and what training must never read, is seen in one place.
"""

from __future__ import annotations

import importlib.util
import io
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from .exam_drawing import (SENTENCES, TEXTURE_KINDS, WORDS, draw_chart, flatten, load_photo, random_crop,
                           shaded_elevation, texture)

ICON_DIRS = (Path("/usr/share/icons/Adwaita"), Path("/usr/share/icons/hicolor"))
GLYPHICONS = Path("/usr/share/fonts/truetype/glyphicons/glyphicons-halflings-regular.ttf")
FONT_AWESOME = Path("/usr/share/fonts/truetype/font-awesome/fontawesome-webfont.ttf")
NOTO_EMOJI = Path("/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf")
TEXT_FONT_DIRS = (Path("/usr/share/fonts/truetype/liberation"), Path("/usr/share/fonts/truetype/freefont"))
#: Debian packages that provide the exam's files (scripts/system-deps.sh installs them).
PACKAGES = {ICON_DIRS[0]: "adwaita-icon-theme", ICON_DIRS[1]: "hicolor-icon-theme",
            GLYPHICONS: "fonts-glyphicons-halflings", FONT_AWESOME: "fonts-font-awesome",
            NOTO_EMOJI: "fonts-noto-color-emoji", TEXT_FONT_DIRS[0]: "fonts-liberation",
            TEXT_FONT_DIRS[1]: "fonts-freefont-ttf"}

#: Single characters that look like a digit (or are one): never drawn alone. O o Q D for 0; I l i j J for 1; Z z
#: for 2; E-like 3s; A h Y y for 4; S s for 5; b G for 6; T L for 7; B for 8; g q P for 9; and their Greek and
#: Cyrillic look-alikes.
DIGIT_LIKE = frozenset("0123456789OoQDIlijJ|!ZzSsbGTLBgqPpyYAhdЗзбЧчОоІіЬьΟοΙΒΖΤΑϹ")
LETTERS = "CEFHKMNRUVWXacefkmnrtuvwxЖФШЩЮЯЛПИЦΣΔΛΞΠΓΨΦΩλμπψω"

Builder = Callable[[np.random.Generator, int], Iterator["Upload"]]


class ExamSourceError(ValueError):
    """A file the exam is made from is missing (one line, naming the Debian package)."""


@dataclass(frozen=True)
class Upload:
    """One exam item: its category, what it was made from (file or font and what was drawn), the text drawn when it
    is text, and the encoded image."""

    category: str
    source: str
    data: bytes
    text: str | None = None


def _require(path: Path) -> Path:
    if not path.exists():
        owner = next((pkg for root, pkg in PACKAGES.items() if path == root or root in path.parents), None)
        hint = f" (apt-get install {owner})" if owner else ""
        raise ExamSourceError(f"{path}: missing, the uploads exam is made from it{hint}")
    return path


def _encode(image: Image.Image, fmt: str, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        image = image.convert("RGB") if image.mode not in ("RGB", "L") else image
        image.save(buf, "JPEG", quality=quality)
    else:
        image.save(buf, "PNG")
    return buf.getvalue()


def _colour(rng: np.random.Generator, light: bool) -> tuple[int, int, int]:
    low, high = (200, 256) if light else (0, 90)
    return tuple(int(v) for v in rng.integers(low, high, 3))


def _screenshot(rng: np.random.Generator, image: Image.Image) -> tuple[bytes, str]:
    """An image on a window background with a margin, maybe enlarged, as PNG or JPEG."""
    background = _colour(rng, light=rng.random() < 0.75)
    margin = int(rng.integers(2, max(3, image.width // 2)))
    scale = float(rng.choice([1.0, 1.0, 1.5, 2.0, 3.0]))
    flat = flatten(image, background)
    canvas = Image.new("RGB", (flat.width + 2 * margin, flat.height + 2 * margin), background)
    canvas.paste(flat, (margin, margin))
    if scale != 1.0:
        canvas = canvas.resize((round(canvas.width * scale), round(canvas.height * scale)), Image.Resampling.BILINEAR)
    fmt = "JPEG" if rng.random() < 0.3 else "PNG"
    return _encode(canvas, fmt, int(rng.integers(75, 96))), fmt


# --- icons ----------------------------------------------------------------------------------------------------

#: Icons that are letters or numerals in a frame (text formatting, "1:1" zoom, 2G/3G/4G/5G signal).
ICON_EXCLUDE = ("format-text-bold", "format-text-italic", "format-text-underline", "format-text-strikethrough",
                "zoom-original", "font-", "2g-", "3g-", "4g-", "5g-", "-hspa-", "-edge-", "-gprs-", "-umts-")


@lru_cache(maxsize=1)
def icon_files() -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(full-colour, symbolic) PNG icons of the installed themes, sorted; digit-like ones (ICON_EXCLUDE) left out."""
    colour, symbolic = [], []
    for root in ICON_DIRS:
        for path in sorted(_require(root).rglob("*.png")):
            if "cursors" in path.parts or any(part in path.name for part in ICON_EXCLUDE):
                continue
            (symbolic if "symbolic" in path.name else colour).append(path)
    return tuple(colour), tuple(symbolic)


def _icons(paths: tuple[Path, ...], category: str) -> Builder:
    def build(rng: np.random.Generator, n: int) -> Iterator[Upload]:
        for index in rng.choice(len(paths), size=min(n, len(paths)), replace=False):
            path = paths[int(index)]
            data = path.read_bytes()
            if rng.random() < 0.5:
                yield Upload(category, str(path), data)
            else:
                with Image.open(io.BytesIO(data)) as image:
                    encoded, fmt = _screenshot(rng, image.convert("RGBA"))
                yield Upload(category, f"{path} ({fmt} screenshot)", encoded)
    return build


def _colour_icons(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    return _icons(icon_files()[0], "icons")(rng, n)


def _symbolic_icons(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    return _icons(icon_files()[1], "symbolic-icons")(rng, n)


# --- glyphs of symbol fonts -----------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _codepoints(path: Path, low: int, high: int) -> tuple[int, ...]:
    from fontTools.ttLib import TTFont

    with TTFont(str(_require(path)), lazy=True) as font:
        return tuple(sorted(cp for cp in font.getBestCmap() if low <= cp <= high))


#: Emoji that show numerals (100, 1234, 10) or are not pictures (skin tones, regional indicator letters).
EMOJI_EXCLUDE = frozenset({0x1F4AF, 0x1F522, 0x1F51F, *range(0x1F3FB, 0x1F400), *range(0x1F1E6, 0x1F200)})


def emoji_codepoints() -> tuple[int, ...]:
    pictures = _codepoints(NOTO_EMOJI, 0x2600, 0x27BF) + _codepoints(NOTO_EMOJI, 0x1F300, 0x1FAFF)
    return tuple(cp for cp in pictures if cp not in EMOJI_EXCLUDE)


def _ui_glyphs(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    """A pictogram of an icon font on a button: dark on light, or light on a coloured or dark button."""
    faces = [(GLYPHICONS, _codepoints(GLYPHICONS, 0xE000, 0xF8FF) + _codepoints(GLYPHICONS, 0x2600, 0x27BF)),
             (FONT_AWESOME, _codepoints(FONT_AWESOME, 0xF000, 0xF8FF))]
    for i in range(n):
        path, codepoints = faces[i % len(faces)]
        char = chr(codepoints[int(rng.integers(len(codepoints)))])
        size = int(rng.choice([16, 24, 32, 48, 64, 96]))
        font = ImageFont.truetype(str(path), size)
        light = rng.random() < 0.6
        background, ink = _colour(rng, light), _colour(rng, not light)
        side = int(size * rng.uniform(1.3, 2.2))
        image = Image.new("RGB", (side, side), background)
        ImageDraw.Draw(image).text((side / 2, side / 2), char, font=font, fill=ink, anchor="mm")
        fmt = "JPEG" if rng.random() < 0.2 else "PNG"
        yield Upload("ui-glyphs", f"{path.name} U+{ord(char):04X} {size}px", _encode(image, fmt), char)


def _emoji(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    """Noto's 136-pixel bitmaps (its only size), scaled as chat apps and pages show them, transparent or on a page."""
    codepoints = emoji_codepoints()
    font = ImageFont.truetype(str(_require(NOTO_EMOJI)), 109)
    for index in rng.choice(len(codepoints), size=min(n, len(codepoints)), replace=False):
        char = chr(codepoints[int(index)])
        image = Image.new("RGBA", (136, 128), (0, 0, 0, 0))
        ImageDraw.Draw(image).text((68, 64), char, font=font, embedded_color=True, anchor="mm")
        side = int(rng.choice([24, 32, 48, 64, 72, 128, 160]))
        image = image.resize((side * 136 // 128, side), Image.Resampling.LANCZOS)
        if rng.random() < 0.5:
            yield Upload("emoji", f"{NOTO_EMOJI.name} U+{ord(char):04X} {side}px", _encode(image, "PNG"), char)
        else:
            encoded, fmt = _screenshot(rng, image)
            yield Upload("emoji", f"{NOTO_EMOJI.name} U+{ord(char):04X} {side}px ({fmt} screenshot)", encoded, char)


# --- text -----------------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def text_fonts() -> tuple[Path, ...]:
    return tuple(sorted(p for d in TEXT_FONT_DIRS for p in _require(d).glob("*.ttf")))


def _text_image(rng: np.random.Generator, text: str, font_path: Path, size: int) -> tuple[bytes, str]:
    """Text drawn on a plain background with a margin: dark on light mostly, sometimes light on dark or coloured."""
    font = ImageFont.truetype(str(font_path), size)
    left, top, right, bottom = font.getbbox(text)
    light = rng.random() < 0.7
    background, ink = _colour(rng, light), _colour(rng, not light)
    margin = int(size * rng.uniform(0.2, 0.8))
    image = Image.new("RGB", (right - left + 2 * margin, bottom - top + 2 * margin), background)
    stroke = int(rng.choice([0, 0, 0, 1, 2]))
    ImageDraw.Draw(image).text((margin - left, margin - top), text, font=font, fill=ink, stroke_width=stroke,
                               stroke_fill=ink)
    fmt = "JPEG" if rng.random() < 0.3 else "PNG"
    return _encode(image, fmt, int(rng.integers(75, 96))), fmt


def _letters(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    fonts = text_fonts()
    for _ in range(n):
        letter = LETTERS[int(rng.integers(len(LETTERS)))]
        path = fonts[int(rng.integers(len(fonts)))]
        size = int(rng.choice([24, 32, 48, 64, 96, 128]))
        data, fmt = _text_image(rng, letter, path, size)
        yield Upload("letters", f"{path.name} {letter!r} {size}px {fmt}", data, letter)


def _words(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    fonts = text_fonts()
    for _ in range(n):
        word = WORDS[int(rng.integers(len(WORDS)))]
        word = {0: word, 1: word.upper(), 2: word.capitalize()}[int(rng.integers(3))]
        path = fonts[int(rng.integers(len(fonts)))]
        size = int(rng.choice([16, 24, 32, 48, 72]))
        data, fmt = _text_image(rng, word, path, size)
        yield Upload("words", f"{path.name} {word!r} {size}px {fmt}", data, word)


def _documents(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    """A paragraph or two on a page, as a screenshot (PNG) or a slightly turned, noisy scan (JPEG)."""
    fonts = text_fonts()
    for _ in range(n):
        path = fonts[int(rng.integers(len(fonts)))]
        size = int(rng.choice([11, 13, 15, 18, 22]))
        font = ImageFont.truetype(str(path), size)
        chosen = rng.choice(len(SENTENCES), size=int(rng.integers(2, 6)), replace=False)
        text = " ".join(SENTENCES[int(i)] for i in chosen)
        width = int(rng.integers(32, 80))
        lines = textwrap.wrap(text, width)
        line_height = int(size * 1.4)
        margin = int(rng.integers(8, 40))
        page_w = int(max(font.getlength(line) for line in lines)) + 2 * margin
        page = Image.new("L", (page_w, line_height * len(lines) + 2 * margin), int(rng.integers(235, 256)))
        draw = ImageDraw.Draw(page)
        for row, line in enumerate(lines):
            draw.text((margin, margin + row * line_height), line, font=font, fill=int(rng.integers(0, 70)))
        if rng.random() < 0.4:
            page = page.rotate(float(rng.uniform(-3, 3)), Image.Resampling.BILINEAR, expand=True, fillcolor=245)
            noisy = np.asarray(page, np.float32) + rng.normal(0, 6, (page.height, page.width))
            page, fmt = Image.fromarray(noisy.clip(0, 255).astype(np.uint8)), "JPEG"
        else:
            fmt = "PNG"
        yield Upload("documents", f"{path.name} {size}px {len(lines)} lines {fmt}",
                     _encode(page, fmt, int(rng.integers(70, 92))), "\n".join(lines))


# --- charts ---------------------------------------------------------------------------------------------------

CHART_KINDS = ("line", "bar", "scatter", "pie", "hist", "heatmap", "box", "area")
#: Family names of the text fonts, for matplotlib (its bundled DejaVu is left alone).
CHART_FAMILIES = ("Liberation Sans", "Liberation Serif", "FreeSans", "FreeSerif")


def _charts(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    from matplotlib import font_manager

    for path in text_fonts():
        font_manager.fontManager.addfont(str(path))
    for i in range(n):
        kind = CHART_KINDS[i % len(CHART_KINDS)]
        family = CHART_FAMILIES[int(rng.integers(len(CHART_FAMILIES)))]
        data, fmt = draw_chart(rng, kind, family)
        yield Upload("charts", f"matplotlib {kind} ({family}, {fmt.upper()})", data)


# --- photos and textures --------------------------------------------------------------------------------------

def photo_files() -> tuple[Path, ...]:
    """The photos scikit-learn and matplotlib ship, and matplotlib's MRI slice."""
    import matplotlib

    sample = Path(matplotlib.get_data_path()) / "sample_data"
    sklearn = importlib.util.find_spec("sklearn")  # its files, without importing it (several seconds)
    if sklearn is None or sklearn.origin is None:
        raise ExamSourceError("scikit-learn is not installed: the uploads exam uses its sample photos")
    images = Path(sklearn.origin).parent / "datasets" / "images"
    return tuple(_require(p) for p in (images / "china.jpg", images / "flower.jpg", sample / "grace_hopper.jpg",
                                       sample / "Minduka_Present_Blue_Pack.png", sample / "s1045.ima.gz"))


def elevation_files() -> tuple[Path, ...]:
    import matplotlib

    sample = Path(matplotlib.get_data_path()) / "sample_data"
    return tuple(_require(sample / name) for name in ("jacksboro_fault_dem.npz", "topobathy.npz"))


def _photo_upload(rng: np.random.Generator, image: Image.Image, longest: int) -> tuple[bytes, str]:
    scale = longest / max(image.size)
    image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                         Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if rng.random() < 0.15:
        image = image.convert("L")
    fmt = "PNG" if rng.random() < 0.15 else "JPEG"
    return _encode(image, fmt, int(rng.integers(60, 96))), fmt


def _photos(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    paths = photo_files()
    photos = [load_photo(p) for p in paths]
    for i in range(n):
        k = i % len(paths)
        crop = random_crop(rng, photos[k], 0.3, 1.0)
        data, fmt = _photo_upload(rng, crop, int(rng.choice([160, 320, 480, 640, 1024])))
        yield Upload("photos", f"{paths[k].name} crop {crop.width}x{crop.height} {fmt}", data)


def _textures(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    paths = photo_files()[:4] + elevation_files()
    images = [load_photo(p) for p in paths[:4]] + [shaded_elevation(p) for p in paths[4:]]
    for i in range(n):
        k = i % len(paths)
        crop = random_crop(rng, images[k], 0.01, 0.08)
        data, fmt = _photo_upload(rng, crop, int(rng.choice([64, 128, 256, 400])))
        yield Upload("textures", f"{paths[k].name} close crop {crop.width}x{crop.height} {fmt}", data)


def _scene_crops(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    paths = photo_files()[:4] + elevation_files()
    images = [load_photo(p) for p in paths[:4]] + [shaded_elevation(p) for p in paths[4:]]
    for i in range(n):
        k = i % len(paths)
        crop = random_crop(rng, images[k], 0.04, 0.25)
        data, fmt = _photo_upload(rng, crop, int(rng.choice([320, 480, 640, 800, 1024])))
        yield Upload("scene-crops", f"{paths[k].name} crop {crop.width}x{crop.height} {fmt}", data)


def _generated_textures(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    for i in range(n):
        kind = TEXTURE_KINDS[i % len(TEXTURE_KINDS)]
        side = int(rng.choice([256, 384, 512]))
        t = texture(rng, kind, side)[..., None]
        dark, light = np.array(_colour(rng, light=False)), np.array(_colour(rng, light=True))
        rgb = dark * (1 - t) + light * t
        ramp = 1 + rng.uniform(-0.25, 0.25) * np.linspace(-1, 1, side, dtype=np.float32)[None, :, None]
        rgb = rgb * ramp + rng.normal(0, rng.uniform(1, 6), (side, side, 1))
        image = Image.fromarray(rgb.clip(0, 255).astype(np.uint8), "RGB")
        data, fmt = _photo_upload(rng, image, int(rng.choice([320, 480, 640, 800])))
        yield Upload("generated-textures", f"{kind} texture {side}px {fmt}", data)


# --- QR codes -------------------------------------------------------------------------------------------------

QR_TEXTS = ("https://example.org/menu", "https://example.com/tickets/check-in", "WIFI:T:WPA;S:guest;P:welcome;;",
            "mailto:office@example.net", "BEGIN:VCARD\nFN:Ann Example\nEND:VCARD", "hello world", "geo:48.85,2.35",
            "https://example.org/a-rather-long-address/with/several/parts?and=a&query=string")


def _qr_codes(rng: np.random.Generator, n: int) -> Iterator[Upload]:
    import segno

    for i in range(n):
        text = QR_TEXTS[i % len(QR_TEXTS)]
        micro = rng.random() < 0.2 and len(text) <= 15
        code = segno.make_micro(text) if micro else segno.make(text, error=str(rng.choice(list("lmqh"))))
        buf = io.BytesIO()
        dark = _colour(rng, light=False)
        code.save(buf, kind="png", scale=int(rng.integers(2, 9)), border=int(rng.integers(0, 5)), dark=dark)
        data, fmt = buf.getvalue(), "PNG"
        if rng.random() < 0.3:  # photographed on a screen or on paper: blurred, scaled, JPEG
            with Image.open(io.BytesIO(data)) as image:
                photo = image.convert("RGB").filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.2))))
            photo = photo.resize((int(photo.width * rng.uniform(0.8, 2.0)),) * 2, Image.Resampling.BILINEAR)
            data, fmt = _encode(photo, "JPEG", int(rng.integers(70, 92))), "JPEG"
        yield Upload("qr-codes", f"segno {'micro ' if micro else ''}QR {code.designator} {fmt}", data, text)


#: Category -> (builder, items). About 1,450 items in all.
CATEGORIES: dict[str, tuple[Builder, int]] = {
    "icons": (_colour_icons, 200),
    "symbolic-icons": (_symbolic_icons, 150),
    "ui-glyphs": (_ui_glyphs, 150),
    "emoji": (_emoji, 120),
    "charts": (_charts, 64),
    "documents": (_documents, 80),
    "photos": (_photos, 100),
    "textures": (_textures, 90),
    "scene-crops": (_scene_crops, 100),
    "generated-textures": (_generated_textures, 84),
    "qr-codes": (_qr_codes, 64),
    "letters": (_letters, 120),
    "words": (_words, 120),
}


#: The seed of the exam `python -m training eval --ood uploads` reports on.
EXAM_SEED = 0


def exam_uploads(seed: int = EXAM_SEED, scale: float = 1.0) -> list[Upload]:
    """Every category's items in turn (:data:`CATEGORIES`), each category from its own seeded generator so that its
    items do not depend on the others; ``scale`` multiplies the counts (at least one item per category).
    Raises ExamSourceError (one line) when a source file is missing."""
    uploads: list[Upload] = []
    for i, (category, (build, count)) in enumerate(CATEGORIES.items()):
        rng = np.random.default_rng([seed, i])
        uploads.extend(build(rng, max(1, round(count * scale))))
    return uploads


def exam_sources() -> tuple[Path, ...]:
    """Every file and folder the exam is made from (training must read none of them)."""
    return (*ICON_DIRS, GLYPHICONS, FONT_AWESOME, NOTO_EMOJI, *TEXT_FONT_DIRS, *photo_files(), *elevation_files())
