"""The one thing pyproject.toml cannot declare without a warning: the optional C extension.

``cudatimer.core._speedups`` is the recorder's C core (pooled event records through the CUDA
runtime torch loaded). It is optional: where it cannot be built (no C compiler or Python
headers), the install goes on and cudatimer runs the same logic in Python, at about 2.4x the
cost per region (``cudatimer.compiled()`` and ``cudatimer --version`` say which runs). Every
other setting is in pyproject.toml.
"""

import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        # One translation unit: _speedups.c includes its parts (cudatimer/core/_c/*.c).
        Extension(
            "cudatimer.core._speedups",
            sources=["cudatimer/core/_speedups.c"],
            depends=sorted(glob.glob("cudatimer/core/_c/*.c")),
            optional=True,
        ),
    ],
)
