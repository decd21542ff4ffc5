"""``fedorasflwr.save_model``: every kind of module it takes comes back from ``load_model``
with the same outputs, in this process and in a fresh one that never imported the user's
package (``load_model`` imports it); what it cannot rebuild is refused before writing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import fedorasflwr
from fedorasflwr import load_model, save_model
from fedorasflwr.search_spaces import build_space
from fedorasflwr.search_spaces.prunable import PrunableNet, build_prunable

REPO = Path(__file__).resolve().parents[1]

#: a user's package of its own, on 1-D signals, written to disk and never installed
SIGNALS = textwrap.dedent(
    """
    from torch import nn


    class SignalNet(nn.Module):
        def __init__(self, channels: int = 8, num_classes: int = 3, length: int = 32):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv1d(1, channels, 5, padding=2), nn.BatchNorm1d(channels), nn.ReLU(),
                nn.MaxPool1d(2),
            )
            self.classifier = nn.Linear(channels * (length // 2), num_classes)

        def forward(self, x):
            return self.classifier(self.features(x).flatten(1))
    """
)


@pytest.fixture
def signals_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``signals.nets:SignalNet`` importable from ``tmp_path/pkgs`` (on ``sys.path`` for this
    test only; the modules it loads are dropped afterwards)."""
    root = tmp_path / "pkgs"
    (root / "signals").mkdir(parents=True)
    (root / "signals" / "__init__.py").write_text("")
    (root / "signals" / "nets.py").write_text(SIGNALS)
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m == "signals" or m.startswith("signals.")]:
        del sys.modules[name]


def _same(a: nn.Module, b: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        assert torch.equal(a.eval()(x), b.eval()(x))


def test_a_search_space_and_a_subnet_round_trip(tmp_path):
    torch.manual_seed(0)
    space = build_space("cnn_s", num_classes=10, input_height=12, input_width=12, width=0.25)
    x = torch.randn(2, 1, 12, 12)
    arch = [n - 1 for n in space.num_options()]  # the last option of every layer
    subnet = space.subnet(arch)
    path = save_model(tmp_path / "sub.pt", subnet, note="mine")
    loaded = load_model(path)
    assert type(loaded).__name__ == "Subnet" and list(loaded.arch) == list(subnet.arch)
    _same(subnet, loaded, x)
    assert torch.load(path, weights_only=True)["note"] == "mine"
    whole = load_model(save_model(tmp_path / "space.pt", space, stage="search"))
    with torch.no_grad():
        assert torch.equal(space.eval()(x, subnet.arch), whole(x, subnet.arch))


def test_a_derived_darts_network_round_trips(tmp_path):
    space = build_space("darts", num_classes=4, in_channels=1, input_height=8, input_width=8)
    genotype = space.genotype().to_text()
    net = type(space).derived_network(
        genotype, **{k: v for k, v in space.spec.items() if k != "name"}
    )
    loaded = load_model(save_model(tmp_path / "d.pt", net, space=space, genotype=genotype))
    _same(net, loaded, torch.randn(2, 1, 8, 8))
    again = save_model(tmp_path / "g.pt", net, space=space.spec, genotype=space.genotype())
    assert torch.load(again, weights_only=True)["genotype"] == genotype
    with pytest.raises(TypeError, match="derived DARTS network with space= and genotype="):
        save_model(tmp_path / "e.pt", net)  # the network carries neither


def test_a_users_own_model_round_trips_in_a_fresh_process(tmp_path, signals_package):
    from signals.nets import SignalNet

    torch.manual_seed(1)
    net = build_prunable(SignalNet, input_shape=(1, 32), widths=[5])
    assert isinstance(net, PrunableNet)
    x = torch.randn(3, 1, 32)
    path = save_model(tmp_path / "model.pt", net)
    _same(net, load_model(path), x)
    torch.save(x, tmp_path / "x.pt")
    expected = net.eval()(x).detach()
    torch.save(expected, tmp_path / "y.pt")
    # a fresh process: ``signals`` importable (PYTHONPATH) but imported by nobody
    script = (
        "import sys, torch; from fedorasflwr import load_model; "
        "assert 'signals' not in sys.modules; "
        f"m = load_model({str(path)!r}); "
        f"x = torch.load({str(tmp_path / 'x.pt')!r}); y = torch.load({str(tmp_path / 'y.pt')!r}); "
        "print(type(m.model).__module__, bool(torch.equal(m(x), y)))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(signals_package), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["signals.nets", "True"]
    # without the import, a file names a package this process never loaded: refused
    strict = script.replace("load_model(", "load_model(import_packages=False, path=")
    gone = subprocess.run(
        [sys.executable, "-c", strict], capture_output=True, text=True, env=env, timeout=300
    )
    assert gone.returncode != 0 and "'signals' is not loaded by this process" in gone.stderr


def test_a_file_naming_a_package_that_is_not_importable_is_refused(tmp_path, signals_package):
    from signals.nets import SignalNet

    path = save_model(tmp_path / "model.pt", build_prunable(SignalNet, input_shape=(1, 32)))
    content = torch.load(path, weights_only=True)
    content["space"]["name"] = "nosuchpkg_fedorasflwr.nets:SignalNet"
    torch.save(content, tmp_path / "moved.pt")
    with pytest.raises(ValueError, match="'nosuchpkg_fedorasflwr', which is not importable"):
        load_model(tmp_path / "moved.pt")


class _Local(nn.Module):  # a plain module: nothing load_model rebuilds
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)


def test_what_load_model_cannot_rebuild_is_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match="is not a module load_model rebuilds"):
        save_model(tmp_path / "plain.pt", _Local())

    def inner() -> type[nn.Module]:
        class Inside(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return self.fc(x)

        return Inside

    with pytest.raises(ValueError, match="defined inside a function"):
        save_model(tmp_path / "inside.pt", build_prunable(inner(), input_shape=(4,)))
    space = build_space("cnn_s", num_classes=10, input_height=12, input_width=12, width=0.25)
    with pytest.raises(ValueError, match="entries save_model writes itself"):
        save_model(tmp_path / "x.pt", space, state_dict={})
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no temp left


def test_save_model_is_public():
    assert fedorasflwr.save_model is save_model
    assert "save_model" in fedorasflwr.__all__
