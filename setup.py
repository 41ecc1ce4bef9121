"""The one thing pyproject.toml cannot declare without a warning: the optional C extension.

``cudatimer._speedups`` is the recorder's C core (pooled event records through the CUDA
runtime torch loaded). It is optional: where it cannot be built (no C compiler or Python
headers), the install goes on and cudatimer runs the same logic in Python, at about 2.4x the
cost per region (``cudatimer.compiled()`` and ``cudatimer --version`` say which runs). Every
other setting is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("cudatimer._speedups", sources=["cudatimer/_speedups.c"], optional=True),
    ],
)
