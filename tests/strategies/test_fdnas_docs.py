"""docs/fdnas.md's Python snippets run as printed: the strategy built from a run config and
started on a grid ("From Python"), and CFDNAS built with and without ``cluster_of``
("Clusters"), each given the names the page assumes (``space``, ``run_config``, ``grid``)."""

from __future__ import annotations

import re

import torch

from fedorasflwr.clients import make_client_app
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.strategies import CFDNAS, FDNASResult
from tests.runconfig import ROOT, tiny_fdnas
from tests.strategies.test_fdnas_derivation import NODES, _load_data
from tests.strategies.test_fdnas_user_space import TinyGatedSpace


def snippet(marker: str) -> str:
    """The one ```python block of docs/fdnas.md that contains ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/fdnas.md").read_text(), re.DOTALL)
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"{len(found)} python blocks of docs/fdnas.md contain {marker!r}"
    return found[0]


def names(method: str) -> dict:
    """What the page assumes: a space of the user's own, a run config and a grid."""
    run_config = tiny_fdnas(
        "unused", **{"method": method, "data.partitioner": "iid", "fdnas.final-rounds": 0}
    )
    torch.manual_seed(0)
    grid = InProcessGrid(make_client_app(_load_data, num_classes=10), run_config, NODES)
    return {"space": TinyGatedSpace(), "run_config": run_config, "grid": grid}


def test_the_from_python_snippet_runs():
    namespace = names("fdnas")
    exec(snippet("strategy = FDNAS("), namespace)  # noqa: S102 - the page's own code
    result = namespace["result"]
    assert isinstance(result, FDNASResult)
    assert len(result.search_history) == 10  # its num_rounds
    (net,) = result.nets
    assert net.target_flops == 0.5 * namespace["space"].max_flops()  # pyproject's target


def test_the_clusters_snippet_runs():
    namespace = names("cfdnas")
    exec(snippet("cluster_of=lambda profile"), namespace)  # noqa: S102 - the page's own code
    strategy = namespace["strategy"]
    assert isinstance(strategy, CFDNAS)
    assert strategy.settings is namespace["settings"]
    assert strategy.cluster_of is not None  # the last of its two strategies: your own tag
