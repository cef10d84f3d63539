"""Headless Chromium for the tests that render a report's HTML: the marker that skips without it, and
the command lines both use."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
HEADLESS = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not installed: apt-get install -y chromium (Debian package 'chromium')",
)


def dump_dom(html: Path) -> str:
    """The DOM of the page `html` after Chromium has loaded it and run its scripts."""
    return subprocess.run(
        [*HEADLESS, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
