"""The README's install lines agree with the pinned versions."""

from __future__ import annotations

import re

from tests.runconfig import ROOT


def test_the_cpu_only_install_pins_the_constraints_torch() -> None:
    """The CPU-only line installs from PyTorch's CPU index exactly the torch and torchvision
    that ``constraints.txt`` pins, so the command after it keeps them."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(
        r"`pip install --index-url https://download.pytorch.org/whl/cpu ([^`]+)`", readme
    )
    assert line is not None, "README.md: no CPU-only install line"
    wanted = dict(
        re.findall(r"^(torch|torchvision)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    )
    assert set(wanted) == {"torch", "torchvision"}
    assert dict(item.split("==") for item in line.group(1).split()) == wanted
