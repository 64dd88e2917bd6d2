"""What the uploads exam (training/uploads.py) draws and cuts, apart from how it encodes and labels each item: the
texts it sets, charts, photos and elevation models as pictures and crops of them, and textures made here."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

WORDS = ("invoice", "receipt", "hello", "welcome", "summary", "weather", "garden", "kitchen", "monday", "market",
         "station", "museum", "planet", "orange", "yellow", "window", "camera", "picture", "letter", "number",
         "forest", "river", "mountain", "coffee", "ticket", "account", "password", "address", "morning", "friday",
         "Thanks", "Settings", "Download", "Cancel", "Search", "Remember", "Meeting", "Report", "Chapter", "Draft",
         "Open", "Save as", "New folder", "Sign in", "Check out", "Next page", "Read more", "Contact us")
SENTENCES = (
    "The committee met on a cold morning to review the proposal for the new library wing.",
    "Please find attached the minutes of the meeting and the revised schedule for the spring term.",
    "Water boils at a lower temperature at high altitude because the air pressure is lower there.",
    "Our records show that the order was shipped last week and should reach you within a few days.",
    "She opened the window, and the smell of rain and cut grass filled the small kitchen.",
    "Terms and conditions apply to every purchase made through the online store.",
    "The museum is closed on public holidays; guided tours leave from the main entrance.",
    "Add the flour slowly, stirring all the time, until the sauce thickens and turns glossy.",
    "This chapter describes how the survey was designed and how the answers were collected.",
    "If you have any questions about your account, reply to this message or call our office.",
    "The river runs through the old town before it widens into the estuary near the harbour.",
    "Remember to bring a warm jacket, sturdy shoes and something to eat for the afternoon walk.",
)


def flatten(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    rgba = image.convert("RGBA")
    flat = Image.new("RGBA", rgba.size, background + (255,))
    return Image.alpha_composite(flat, rgba).convert("RGB")


def load_photo(path: Path) -> Image.Image:
    if path.name.endswith(".ima.gz"):  # 256x256 big-endian 16-bit MRI slice
        pixels = np.frombuffer(gzip.decompress(path.read_bytes()), ">u2").reshape(256, 256).astype(np.float32)
        return Image.fromarray((pixels / pixels.max() * 255).astype(np.uint8))
    with Image.open(path) as image:
        return flatten(image, (255, 255, 255)) if image.mode in ("RGBA", "P", "LA") else image.convert("RGB")


def shaded_elevation(path: Path) -> Image.Image:
    from matplotlib import colormaps
    from matplotlib.colors import LightSource

    with np.load(path) as data:
        elevation = np.asarray(data["elevation"] if "elevation" in data else data[data.files[0]], np.float64)
    rgb = LightSource(azdeg=315, altdeg=45).shade(elevation, cmap=colormaps["gist_earth"], blend_mode="soft")
    return Image.fromarray((rgb[..., :3] * 255).astype(np.uint8))


def random_crop(rng: np.random.Generator, image: Image.Image, low: float, high: float) -> Image.Image:
    area = rng.uniform(low, high) * image.width * image.height
    aspect = float(np.exp(rng.uniform(-0.5, 0.5)))
    w = int(min(image.width, max(8, np.sqrt(area * aspect))))
    h = int(min(image.height, max(8, np.sqrt(area / aspect))))
    x, y = int(rng.integers(0, image.width - w + 1)), int(rng.integers(0, image.height - h + 1))
    return image.crop((x, y, x + w, y + h))


def draw_chart(rng: np.random.Generator, kind: str, family: str) -> tuple[bytes, str]:
    """One matplotlib chart of ``kind`` (:data:`CHART_KINDS` of training.uploads) set in ``family``, as PNG or JPEG
    bytes and the format's name."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    with rc_context({"font.family": family}):
        size = (float(rng.uniform(3, 8)), float(rng.uniform(2.5, 5)))
        fig = Figure(figsize=size, dpi=int(rng.choice([50, 72, 100])))
        ax = fig.add_subplot()
        x = np.arange(int(rng.integers(6, 40)))
        if kind == "line":
            for _ in range(int(rng.integers(1, 4))):
                ax.plot(x, np.cumsum(rng.normal(0, 1, len(x))), marker="o" if rng.random() < 0.3 else None)
            ax.grid(rng.random() < 0.5)
        elif kind == "bar":
            ax.bar(x[:12], rng.uniform(1, 10, len(x[:12])), color=f"C{int(rng.integers(10))}")
        elif kind == "scatter":
            ax.scatter(rng.normal(0, 1, 200), rng.normal(0, 1, 200), s=8, c=rng.uniform(0, 1, 200))
        elif kind == "pie":
            wedges = int(rng.integers(3, 7))
            ax.pie(rng.uniform(1, 5, wedges), labels=[WORDS[int(j)] for j in rng.choice(len(WORDS), wedges)])
        elif kind == "hist":
            ax.hist(rng.normal(0, 1, 500), bins=int(rng.integers(10, 40)))
        elif kind == "heatmap":
            fig.colorbar(ax.imshow(rng.normal(0, 1, (10, 14)).cumsum(axis=1), cmap="viridis"), ax=ax)
        elif kind == "box":
            ax.boxplot([rng.normal(m, 1, 50) for m in rng.uniform(0, 3, 4)])
        else:
            ax.stackplot(x, np.abs(rng.normal(1, 0.5, (3, len(x)))).cumsum(axis=1))
        ax.set_title(WORDS[int(rng.integers(len(WORDS)))].capitalize())
        buf = io.BytesIO()
        fmt = "jpeg" if rng.random() < 0.25 else "png"
        fig.savefig(buf, format=fmt, metadata={"Software": None} if fmt == "png" else None)
    return buf.getvalue(), fmt


TEXTURE_KINDS = ("wood", "marble", "weave", "bricks", "gravel", "clouds", "grass")


def _smooth_noise(rng: np.random.Generator, side: int, cell: int) -> np.ndarray:
    coarse = rng.random((side // cell + 3, side // cell + 3)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse, "F").resize((side + 3 * cell, side + 3 * cell),
                                                         Image.Resampling.BICUBIC))[cell:cell + side, cell:cell + side]


def texture(rng: np.random.Generator, kind: str, side: int) -> np.ndarray:
    """A side x side texture of one of TEXTURE_KINDS, 0..1."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    turbulence = sum(_smooth_noise(rng, side, max(2, side // f)) / f for f in (4, 8, 16, 32))
    if kind == "wood":
        cx, cy = rng.uniform(-1, 2, 2)
        texture = np.sin(2 * np.pi * (np.hypot(xx - cx, (yy - cy) * 0.2) * rng.uniform(8, 20) + 1.5 * turbulence))
    elif kind == "marble":
        texture = np.sin(2 * np.pi * (xx * rng.uniform(2, 6) + yy * rng.uniform(0, 3)) + 6 * turbulence)
    elif kind == "weave":
        f = rng.uniform(12, 40)
        over = np.sign(np.sin(np.pi * xx * f)) * np.sign(np.sin(np.pi * yy * f))
        texture = np.where(over > 0, np.sin(np.pi * xx * f * 2), np.sin(np.pi * yy * f * 2)) + 0.5 * turbulence
    elif kind == "bricks":
        rows, f = rng.uniform(6, 16), rng.uniform(3, 8)
        row = np.floor(yy * rows)
        u = xx * f + 0.5 * (row % 2)
        mortar = (np.abs(yy * rows - np.round(yy * rows)) < 0.06) | (np.abs(u - np.round(u)) < 0.04)
        tone = _smooth_noise(rng, side, max(2, side // 12))
        texture = np.where(mortar, 1.0, -0.6 + 0.4 * tone) + 0.2 * turbulence
    elif kind == "gravel":
        from scipy import ndimage

        seeds = np.zeros((side, side), bool)
        count = int(side * side / rng.uniform(60, 300))
        seeds[rng.integers(0, side, count), rng.integers(0, side, count)] = True
        distance = ndimage.distance_transform_edt(~seeds)
        texture = -distance / max(float(distance.max()), 1.0) + 0.3 * turbulence
    elif kind == "clouds":
        texture = turbulence
    else:  # grass: many short blades, leaning one way
        picture = Image.new("F", (side, side), 0.0)
        draw = ImageDraw.Draw(picture)
        lean = rng.uniform(-0.3, 0.3)
        for x, y, length in zip(rng.uniform(0, side, 1500), rng.uniform(0, side, 1500), rng.uniform(6, 30, 1500)):
            draw.line([(x, y), (x + lean * length + rng.normal(0, 2), y - length)], fill=float(rng.uniform(0.3, 1)),
                      width=int(rng.integers(1, 3)))
        texture = np.asarray(picture) + 0.3 * turbulence
    texture = np.asarray(texture, np.float32)
    return (texture - texture.min()) / max(float(np.ptp(texture)), 1e-6)
