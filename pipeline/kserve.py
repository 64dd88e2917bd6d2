"""The former name of :mod:`pipeline.kserve_deploy`, kept only until its last importers switch to the new name.

It is that module itself (the same object in ``sys.modules``), so attributes patched through either name agree.
"""

from __future__ import annotations

import sys

from pipeline import kserve_deploy

sys.modules[__name__] = kserve_deploy
