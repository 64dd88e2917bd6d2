"""The one image -> model-input contract, shared by training and serving.

Every image, whether a user's photo posted to TorchServe or a 28x28 MNIST array read during training, goes
through its model's profile (:class:`Profile`: ``canvas`` then ``normalize``), so train and serve cannot drift.
This module is the contract's public face; its parts:

- handler/decoding.py: request bytes -> a grayscale array (Pillow, size limits, EXIF, JPEG luma);
- handler/canvas.py: a grayscale array -> the 28x28 canvas: cropped to its content, fitted into a 20x20 box and
  centred by mass as MNIST was made (the ``digits`` profile's version 1), or the whole frame kept
  (``full-frame``, for centred pictures such as Fashion-MNIST whose outline and size carry the class);
- handler/digits.py and handler/photo.py: the digits profile's versions; from version 2 on, photos and scans,
  whose background is not one flat level, have their light divided out and their digit found among paper edges,
  shadows and table first, and a clean picture (MNIST, a drawing, a rendered digit) gets version 1's canvas bit
  for bit;
- handler/profiles.py: the registry, one entry per profile (every served version's canvas, the statistics,
  training defaults, quantization), checked at import; :func:`profile_of` gives back the profile a model's
  metadata.json records and refuses one it does not know.

:meth:`Profile.read` also tells whether a digits image holds several digits side by side (:func:`photo.several`),
from the same decoding and ink map; the canvas is the same with or without that look.

These modules import only numpy, Pillow and scipy, so that they can be packed into the model archive and
imported by the handler without the training code.
"""

from __future__ import annotations

import numpy as np

from .canvas import BOX, CANVAS, INK_THRESHOLD
from .decoding import (DEFAULT_MAX_PIXELS, FORMATS, ImageInput, ImageTooLargeError, InvalidImageError, decode_image,
                       gray_array)
from .digits import to_canvas, to_canvas_v2, to_canvas_v3, to_canvas_v4
from .profiles import (DATASET_PROFILES, ENTRIES, MEAN, PROFILES, REGISTRY, SERVED, STD, Profile, ProfileEntry,
                       ProfileError, profile_of, to_full_frame)

__all__ = ["BOX", "CANVAS", "DATASET_PROFILES", "DEFAULT_MAX_PIXELS", "DIGITS", "DIGITS_V1", "DIGITS_V2", "DIGITS_V3", "ENTRIES",
           "FORMATS", "FULL_FRAME", "INK_THRESHOLD", "ImageInput", "ImageTooLargeError", "InvalidImageError", "MEAN",
           "PREPROCESSING_VERSION", "PROFILES", "Profile", "ProfileEntry", "ProfileError", "REGISTRY", "SERVED", "STD",
           "canvases_from_arrays", "decode_image", "gray_array", "is_blank", "normalize", "preprocess", "profile_of",
           "to_canvas", "to_canvas_v2", "to_canvas_v3", "to_canvas_v4", "to_full_frame"]

#: The digits profile new models are built with (version 4: the paper and its light found first, then the digit as
#: the ink on it). Photos and scans have their light removed and their digit found first (handler/photo.py).
DIGITS = PROFILES["digits"]
#: The digits profile before the photo path, and the earlier photo paths, for models built with them.
DIGITS_V1 = SERVED["digits", "1"]
DIGITS_V2 = SERVED["digits", "2"]
DIGITS_V3 = SERVED["digits", "3"]
#: Whole frame kept; the customary Fashion-MNIST training-set statistics.
FULL_FRAME = PROFILES["full-frame"]
#: The digits version new models record in metadata.json.
PREPROCESSING_VERSION = DIGITS.version


def is_blank(tensor: np.ndarray) -> bool:
    """True for the model input of an image without any ink (uniform, or nothing above the threshold)."""
    return bool(np.ptp(tensor) == 0)  # every real stroke leaves some pixel above the background


def normalize(canvases: np.ndarray) -> np.ndarray:
    """uint8 canvases (N, 28, 28) -> float32 model input (N, 1, 28, 28), digits profile."""
    return DIGITS.normalize(canvases)


def preprocess(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """One image -> float32 (1, 28, 28): the exact tensor a digits model was trained on."""
    return DIGITS.preprocess(image, max_pixels)


def canvases_from_arrays(images: np.ndarray) -> np.ndarray:
    """The training path: raw uint8 images (N, H, W) -> canonical uint8 canvases (N, 28, 28)."""
    return DIGITS.canvases_from_arrays(images)
