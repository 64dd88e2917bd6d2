"""The report page's parts, shared by the held-out report (training/report.py) and the report on the user's own
images (training/report_images.py): one self-contained HTML page, every text escaped, every image an inline PNG
data: URI, no script; its Content-Security-Policy allows nothing else to load."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

QUERY_SCALE = 3  # 84 px
NEIGHBOUR_SCALE = 2  # 56 px
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'none'"
#: How every report page begins: `training report --out` replaces only a file that starts so.
PAGE_HEADER = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
               f'<meta http-equiv="Content-Security-Policy" content="{CSP}">')

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}table.facts td,table.facts th{text-align:left}
td.diag{background:#cfe8cf;font-weight:bold}td.zero{color:#bbb}
.case{display:flex;align-items:flex-start;gap:10px;padding:6px 0;border-bottom:1px solid #eee}
.query{width:190px;flex:none}.query p{margin:2px 0;font-size:12px;word-break:break-all}
.nbs{display:flex;flex-wrap:wrap;gap:6px}figure{margin:0;text-align:center;font-size:11px;width:60px}
figure img,.missing{width:56px;height:56px;image-rendering:pixelated;border:2px solid #888;display:block}
figure.same img{border-color:#3a3}figure.other img,figure.other .missing{border-color:#c33}
.missing{font-size:9px;overflow:hidden;word-break:break-all;background:#f5f5f5;box-sizing:border-box}
img.q{width:84px;height:84px;image-rendering:pixelated;border:1px solid #888}.note{color:#555;font-size:12px}
code{background:#f3f3f3;padding:0 3px}
"""


class GalleryImages(Protocol):
    """What a page needs of the gallery: a drawn item (PNG data: URI, None where it cannot be drawn) and a name."""

    def uri(self, item: int) -> str | None: ...

    def name(self, item: int) -> str: ...


@dataclass
class Case:
    """One image and the served answer for it. ``pred``: what the page shows as answered (the held-out report: the
    k-NN vote; the images report: the served answer, ``unknown`` included); ``truth`` None when no label is known;
    ``title``: how the page names the image (default ``held-out #position``); ``reason``: why it is unknown;
    ``vote``: the k-NN vote's label, answered or not."""

    position: int
    truth: str | None
    pred: str
    confidence: float
    score: float
    unknown: bool
    neighbours: list[tuple[int, str, float]]  # (gallery id, label, distance)
    title: str = ""
    reason: str | None = None
    vote: str | None = None


def escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def number(value: object, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def png_data_uri(canvas: np.ndarray, scale: int = 1) -> str:
    """A uint8 image (H, W) as a PNG data: URI, enlarged `scale` times with nearest-neighbour."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(canvas, dtype=np.uint8), "L")
    if scale != 1:
        image = image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def facts_table(rows: Sequence[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="facts" id="facts">{body}</table>'


def confusion_table(rows: Sequence[str], columns: Sequence[str], matrix: np.ndarray, recall: Sequence[float],
                    unknown: Sequence[int] | None, note: str, corner: str = "true \\ voted") -> str:
    """Rows: true classes; columns: answers; the cell where both name the same class is the diagonal. `unknown`:
    per row, how many were answered unknown (a last column; None where the answers' columns hold it)."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for i, name in enumerate(rows):
        cells = []
        for j, count in enumerate(matrix[i]):
            kind = "diag" if columns[j] == name else ("zero" if count == 0 else "")
            cells.append(f'<td class="{kind}">{int(count)}</td>' if kind else f"<td>{int(count)}</td>")
        body.append(f'<tr data-class="{escape(name)}"><th>{escape(name)}</th>{"".join(cells)}'
                    f"<td>{int(matrix[i].sum())}</td><td>{recall[i]:.3f}</td>"
                    + ("" if unknown is None else f"<td>{unknown[i]}</td>") + "</tr>")
    tail = "" if unknown is None else "<th>unknown</th>"
    return (f'<table id="confusion"><thead><tr><th>{escape(corner)}</th>{head}<th>n</th><th>recall</th>{tail}'
            f'</tr></thead><tbody>{"".join(body)}</tbody></table><p class="note">{escape(note)}</p>')


def _case_html(case: Case, canvas: np.ndarray, threshold: float, gallery: GalleryImages, answered: str) -> str:
    verdict = f"score {case.score:.4f}: accepted"
    if case.unknown:
        verdict = (f"score {case.score:.4f} {'>' if case.score > threshold else '<='} {threshold:.4f}: unknown"
                   + (f" ({case.reason})" if case.reason else ""))
    title = case.title or f"held-out #{case.position}"
    truth = "" if case.truth is None else f"true <b>{escape(case.truth)}</b>, "
    side_of = case.pred if case.truth is None else case.truth
    figures = []
    for item, label, dist in case.neighbours:
        uri = gallery.uri(item)
        picture = (f'<img class="nb" src="{uri}" alt="{escape(label)}">' if uri
                   else f'<div class="missing" title="{escape(gallery.name(item))}">{escape(gallery.name(item))}</div>')
        figures.append(f'<figure class="{"same" if label == side_of else "other"}" data-gallery-id="{item}">'
                       f"{picture}<figcaption>{escape(label)} · {dist:.3f}</figcaption></figure>")
    return (f'<div class="case" data-position="{case.position}"><div class="query">'
            f'<img class="q" src="{png_data_uri(canvas, QUERY_SCALE)}" alt="{escape(title)}">'
            f"<p>{escape(title)}: {truth}{answered} <b>{escape(case.pred)}</b> (confidence {case.confidence:.2f})</p>"
            f'<p>{escape(verdict)}</p></div><div class="nbs">{"".join(figures)}</div></div>')


def cases_section(kind: str, title: str, explain: str, cases: Sequence[Case], total: int, canvases: np.ndarray,
                  threshold: float, gallery: GalleryImages, answered: str = "voted") -> str:
    """A titled list of cases: each image's canvas as the model received it, the answer, and its k nearest
    gallery images (green: the true class, or the answer where no label is known) with their distances."""
    parts = [f'<h2 id="{kind}-title">{escape(title)}</h2>',
             f'<p class="note">{escape(explain)} Showing {len(cases)} of {total}.</p>',
             f'<section id="{kind}" data-cases="{len(cases)}" data-total="{total}">']
    parts += [_case_html(case, canvases[case.position], threshold, gallery, answered) for case in cases]
    parts.append("</section>")
    return "".join(parts)


def page(title: str, parts: Sequence[str]) -> str:
    """The whole page around its parts."""
    return "".join([PAGE_HEADER, f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
                    f"<h1>{escape(title)}</h1>", *parts, "</body></html>\n"])
