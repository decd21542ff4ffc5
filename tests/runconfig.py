"""The app's run config as Flower hands it to the apps, plus tiny overrides for tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


#: for tests whose claim holds whatever the data's size (a resumed run equals the
#: uninterrupted one; a malformed reply changes nothing; messages travel packed): each
#: client draws 64 rows of its own (the sampled partitioner; about one batch) instead of
#: its share of MNIST-5k, so the heavier methods' local training (DARTS above all) is short
FEW_ROWS = {"data.partitioner": "sampled", "data.partition-size": 64}


def pyproject_run_config() -> dict[str, Any]:
    """``[tool.flwr.app.config]`` flattened as Flower does: sub-tables become dotted keys."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def tiny_fedoras(cache_dir: Path | str, **overrides: Any) -> dict[str, Any]:
    """MNIST-5k, a quarter-width cnn_s: Stage 1 with 2 rounds of 6 clients (no lr probe), a
    search of 8 paths per tier, 1 fine-tuning round of 3 clients, no rand-init comparison."""
    config = pyproject_run_config()
    config.update(
        {
            "data.cache-dir": str(cache_dir),
            "onnx": False,  # ONNX export has its own tests (test_export.py, the README run)
            "data.partitioner": "iid",
            "space.width": 0.25,
            "fedoras.rounds": 2,
            "fedoras.clients-per-round": 6,
            "fedoras.tier-samples": 500,
            "fedoras.eval-paths": 2,
            "fedoras.local-epochs": 1,
            "fedoras.search-population": 4,
            "fedoras.search-offspring": 2,
            "fedoras.search-evaluations": 8,
            "fedoras.search-clients": 2,
            "fedoras.finetune-rounds": 1,
            "fedoras.finetune-clients-per-round": 3,
            "fedoras.compare-rand-init": False,
            # Stage 1's lr probe (48 server-side steps per rate, before round 1) has its own
            # tests (test_fedoras_lr_probe.py, test_checkpoints.py's resume); the README run
            # and the presets run it by default
            "fedoras.lr-probe": False,
        }
    )
    config.update(overrides)
    return config


def tiny_fdnas(cache_dir: Path | str, **overrides: Any) -> dict[str, Any]:
    """FDNAS on MNIST-5k with the paper's class-group split, a tiny mbconv space, 1 round each."""
    config = pyproject_run_config()
    config.update(
        {
            "method": "fdnas",
            "data.cache-dir": str(cache_dir),
            "onnx": False,  # ONNX export has its own tests (test_export.py, the README run)
            "data.partitioner": "class-groups",
            "space.width": 0.25,
            "space.layers-per-block": 1,
            "fdnas.rounds": 1,
            "fdnas.cluster-rounds": 1,
            "fdnas.final-rounds": 1,
            "fdnas.batch-size": 64,
        }
    )
    config.update(overrides)
    return config


def tiny_decnas(cache_dir: Path | str, **overrides: Any) -> dict[str, Any]:
    """DecNAS on MNIST-5k: an eighth-width ConvNet, 1 iteration of 1 round, 1 FedAvg round each."""
    config = pyproject_run_config()
    config.update(
        {
            "method": "decnas",
            "data.cache-dir": str(cache_dir),
            "onnx": False,  # ONNX export has its own tests (test_export.py, the README run)
            "space.width": 0.125,
            "decnas.initial-reduction": 0.1,
            "decnas.max-iterations": 1,
            "decnas.rounds": "1",
            "decnas.num-groups": 3,
            "decnas.gm0-rounds": 1,
            "decnas.final-rounds": 1,
            "decnas.batch-size": 64,
        }
    )
    config.update(overrides)
    return config


def readme_bash_blocks() -> list[str]:
    """The ```bash blocks of README.md, in order: the run command first, the test command next."""
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), re.S)


def readme_run_command() -> str:
    """The first command of the README: the one that installs and runs the default search."""
    blocks = readme_bash_blocks()
    assert blocks, "README.md must open with a bash block holding the run command"
    return blocks[0].strip()


def tiny_fednas(cache_dir: Path | str, **overrides: Any) -> dict[str, Any]:
    """FedNAS on MNIST-5k: a one-cell darts space of 2 channels, 1 round, 1 FedAvg round."""
    config = pyproject_run_config()
    config.update(
        {
            "method": "fednas",
            "data.cache-dir": str(cache_dir),
            "onnx": False,  # ONNX export has its own tests (test_export.py, the README run)
            "data.partitioner": "iid",
            "space.name": "darts",
            "space.width": 0.25,
            "space.layers-per-block": 1,
            "fednas.rounds": 1,
            "fednas.final-rounds": 1,
            "fednas.batch-size": 64,
        }
    )
    config.update(overrides)
    return config
