"""The model's Open Inference v2 interface, declared once: the handler writes it (:mod:`handler.protocols`),
the gateway's model metadata declares it and clients name its parameter. The typed outputs are the answer's
columns (:mod:`handler.answer`). Standard library only, so the client and the gateway import it without numpy
or Pillow."""

from __future__ import annotations

from .answer import COLUMNS, EMBEDDING_COLUMNS

Tensor = tuple[str, str, tuple[int, ...]]

#: The typed outputs: (name, datatype, shape of one image's row); the shape gains a leading batch dimension.
V2_OUTPUTS: tuple[Tensor, ...] = tuple((c.name, c.datatype, c.shape) for c in COLUMNS)
#: Outputs present with the embedding option (asking for one of them by name turns the option on).
V2_EMBEDDING_OUTPUTS: tuple[Tensor, ...] = tuple((c.name, c.datatype, c.shape) for c in EMBEDDING_COLUMNS)
#: Present only when an image of the request failed: its message per row, "" for answered rows.
V2_ERROR_OUTPUT: Tensor = ("error", "BYTES", ())
#: The request parameter choosing typed outputs ("tensors", the default) or JSON text per input ("json").
OUTPUT_FORMAT = "output_format"
OUTPUT_FORMATS = ("tensors", "json")
#: What an input may carry (any input name is accepted): (name, datatype, shape), as metadata declares it.
V2_INPUTS: tuple[Tensor, ...] = (
    ("image", "BYTES", (-1,)),
    ("pixels", "FP32", (-1, 1, 28, 28)),
    ("pixels_uint8", "UINT8", (-1, 1, 28, 28)),
)
