"""Shared test helpers: the fake GPU, the NVTX injection harness, subprocess runners,
the browser driver, report fixtures and snapshots."""
