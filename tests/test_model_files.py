"""``fedorasflwr.load_model``: every kind of model file, written by the real runners on tiny
runs, comes back as the module the run had, in eval mode, with the same outputs; a file it
cannot rebuild is refused naming the path and the reason. Also what these runs return:
DecNAS's deployable ``result.arrays``, FDNAS's averaged test accuracy, and every final model's
accuracy on the server's global test set (the runs hold one: ``data.global-test``)."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import ArrayRecord

from fedorasflwr import load_model
from fedorasflwr.artifacts import load_checkpoint, save_checkpoint
from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import parse_run_config
from fedorasflwr.data import load_global_test, load_server_data
from fedorasflwr.export import example_inputs
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.model_files import builder_of
from fedorasflwr.progress import summary_lines
from fedorasflwr.results import snake_keys
from fedorasflwr.runs import RunFiles
from fedorasflwr.search_spaces import SearchSpace, build_prunable, build_space
from fedorasflwr.search_spaces.widths import width_net
from fedorasflwr.server_app import runner
from fedorasflwr.training import evaluate, ordered_loader, refresh_batchnorm, torch_device
from tests.runconfig import tiny_decnas, tiny_fdnas, tiny_fednas, tiny_fedoras
from tests.strategies.test_dpfnas_strategy import small_dpfnas
from tests.strategies.test_widths import tiny as tiny_widths

#: every run holds a global test set: 45 digits of each class (mnist5k's 500, less the server
#: slice's 50, times data.global-test-fraction 0.1)
GLOBAL = {"data.global-test": True}
GLOBAL_COUNT = 450

#: method -> (its runner module, its tiny run config, nodes)
RUNS = {
    "fedoras": (
        "fedoras",
        lambda cache: tiny_fedoras(
            cache,
            **{
                "fedoras.num-tiers": 1,
                "fedoras.rounds": 1,
                "fedoras.compare-rand-init": True,
                **GLOBAL,
            },
        ),
        6,
    ),
    "cfdnas": ("fdnas", lambda cache: tiny_fdnas(cache, method="cfdnas", **GLOBAL), 6),
    "dpfnas": ("dpfnas", lambda cache: small_dpfnas(cache, **GLOBAL), 2),
    "decnas": ("decnas", lambda cache: tiny_decnas(cache, **GLOBAL), 6),
    "fednas": ("fednas", lambda cache: tiny_fednas(cache, **GLOBAL), 2),
    "heterofl": ("widths", lambda cache: tiny_widths(cache, "heterofl", **GLOBAL), 4),
    "fjord": ("widths", lambda cache: tiny_widths(cache, "fjord", **GLOBAL), 4),
}
#: the width baselines: their checkpoint.pt holds the full-width ConvNet
WIDTHS = ("heterofl", "fjord")


class Run:
    """One tiny run of a method's runner, with what it saved and what ``start`` returned."""

    def __init__(self, method: str, cache: Path, out_dir: Path) -> None:
        module_name, make_config, nodes = RUNS[method]
        config = make_config(cache)
        self.settings = parse_run_config(config)
        self.saved: dict[str, dict[str, Any]] = {}
        self.out_dir = out_dir
        module = importlib.import_module(f"fedorasflwr.methods.{module_name}.runner")
        # the runner's ``start``: its own name, or ``runs.start`` where it uses the module
        owner = module if hasattr(module, "start") else module.runs
        real_start, real_save = owner.start, RunFiles.save

        def start(strategy, *args, **kwargs):
            self.strategy = strategy
            self.result = real_start(strategy, *args, **kwargs)
            return self.result

        def save(files, name, arrays, **kwargs):
            self.saved[f"{name}.pt"] = {"arrays": arrays, **kwargs}
            return real_save(files, name, arrays, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(owner, "start", start)
            patch.setattr(RunFiles, "save", save)
            self.document = runner(method)(
                InProcessGrid(client_app, config, nodes), self.settings, out_dir
            )
        self.inputs = example_inputs(self.settings.data, 4)[0]

    def model_files(self) -> list[str]:
        return sorted(p.name for p in self.out_dir.glob("*.pt"))


@pytest.fixture(scope="module")
def runs(data_cache, tmp_path_factory):
    made: dict[str, Run] = {}

    def run(method: str) -> Run:
        if method not in made:
            made[method] = Run(method, data_cache, tmp_path_factory.mktemp(method))
        return made[method]

    return run


def _loaded(module: torch.nn.Module, arrays: ArrayRecord) -> torch.nn.Module:
    original = copy.deepcopy(module)
    original.load_state_dict(arrays.to_torch_state_dict(), strict=True)
    return original.eval()


def _same_outputs(loaded: torch.nn.Module, original: torch.nn.Module, x: torch.Tensor) -> None:
    """Equal logits on ``x``; a supernet on two of its paths (and DARTS's mixed network)."""
    assert not loaded.training
    calls: list[tuple[Any, ...]] = [(x,)]
    if isinstance(original, SearchSpace):
        options = original.num_options()
        calls = [(x, tuple(0 for _ in options)), (x, tuple(n - 1 for n in options))]
        if type(original).__name__ == "DartsSpace":
            calls.append((x,))
    with torch.no_grad():
        for args in calls:
            torch.testing.assert_close(loaded(*args), original(*args), rtol=0, atol=0)


# the files each run writes, and the module each must come back as
KINDS = {
    "fedoras": ["checkpoint.pt", "supernet.pt", "tier-1-random-init.pt", "tier-1.pt"],
    "cfdnas": [
        "checkpoint.pt",
        "cluster-0.pt",
        "cluster-1.pt",
        "cluster-2.pt",
        "fdnas.pt",
        "supernet.pt",
    ],
    "dpfnas": ["checkpoint.pt", "derived.pt", "supernet.pt"],
    "decnas": ["checkpoint.pt", "gm-0.pt", "gm-1-tuned.pt", "gm-1.pt"],
    "fednas": ["checkpoint.pt", "derived.pt", "supernet.pt"],
    **{m: ["checkpoint.pt", "tier-1.pt", "tier-2.pt", "tier-3.pt", "tier-4.pt"] for m in WIDTHS},
}


@pytest.mark.parametrize("method", list(RUNS))
def test_every_model_file_a_run_writes_loads_with_the_runs_outputs(runs, method):
    run = runs(method)
    assert run.model_files() == KINDS[method]
    for name in run.model_files():
        loaded = load_model(run.out_dir / name)
        content = load_checkpoint(run.out_dir / name)
        if name in run.saved:  # written by RunFiles.save: it names its builder
            entry = run.saved[name]
            assert content["builder"] == entry["builder"]
            module = entry.get("model")
            original = _loaded(run.strategy.space if module is None else module, entry["arrays"])
        elif method == "decnas":  # checkpoint.pt: GM_T as searched, with its spec
            original = _loaded(build_prunable(**content["space"]), run.result.untuned_arrays)
        elif method in WIDTHS:  # checkpoint.pt: the full-width ConvNet as trained
            image = {k: v for k, v in content["space"].items() if k != "name"}
            original = _loaded(width_net(image, 1.0), run.result.arrays)
        else:  # checkpoint.pt and FedorAS's supernet.pt: the searched supernet
            supernet = run.result.supernet if method == "cfdnas" else run.result.arrays
            original = _loaded(run.strategy.space, supernet)
        assert type(loaded) is type(original), name
        _same_outputs(loaded, original, run.inputs)


def test_decnas_result_arrays_is_the_tuned_model_and_its_file(runs):
    run = runs("decnas")
    final = run.result.frontier[-1]
    assert final.iteration == 1 and final.tuned_arrays is not None
    tuned, searched = final.tuned_arrays.to_torch_state_dict(), final.arrays.to_torch_state_dict()
    assert any(not torch.equal(tuned[k], searched[k]) for k in tuned)  # tuning moved it
    for record, expected in ((run.result.arrays, tuned), (run.result.untuned_arrays, searched)):
        state = record.to_torch_state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], expected[k]) for k in state)
    assert run.document["final-model"] == "gm-1-tuned.pt"
    # the files hold these weights with BatchNorm statistics re-estimated on the server's
    # slice, as scored (runs.RunFiles.save_final): every weight equal, statistics refreshed
    for name, weights in (("gm-1-tuned.pt", tuned), ("gm-1.pt", searched)):
        written = load_checkpoint(run.out_dir / name)["state_dict"]
        assert written.keys() == weights.keys()
        statistics = {k for k in weights if k.endswith(("running_mean", "running_var"))}
        trained = [k for k in weights if k not in statistics and "num_batches" not in k]
        assert trained and all(torch.equal(written[k], weights[k]) for k in trained)
        assert any(not torch.equal(written[k], weights[k]) for k in statistics)
    deployed = load_model(run.out_dir / run.document["final-model"])
    original = _loaded(build_prunable(**final.spec), run.saved["gm-1-tuned.pt"]["arrays"])
    _same_outputs(deployed, original, run.inputs)


def test_fdnas_averaged_test_accuracy_weights_partitions_by_test_samples(runs):
    run = runs("cfdnas")
    assert "test-count" in run.document["accuracy-convention"]
    for net, entry in zip(run.result.nets, run.document["nets"], strict=True):
        count = sum(net.test_count.values())
        by_hand = sum(net.test_accuracy[p] * net.test_count[p] for p in net.test_count) / count
        assert net.averaged_test_accuracy == pytest.approx(by_hand, abs=1e-12)
        assert entry["averaged-accuracy"] == net.averaged_test_accuracy
        assert entry["test-count"] == net.test_count and count > 0


# --- files it refuses --------------------------------------------------------------------


def _tiny_space() -> SearchSpace:
    torch.manual_seed(0)
    return build_space("cnn_s", num_classes=3, input_height=8, input_width=8, width=0.25)


def _subnet_file(path: Path, **entries: Any) -> Path:
    space = _tiny_space()
    arch = tuple(0 for _ in space.num_options())
    content = {"arch": list(arch), "builder": "subnet", **entries}
    arrays = ArrayRecord(space.subnet(arch).state_dict())
    return save_checkpoint(path, space_spec=space.spec, arrays=arrays, stage="finetune", **content)


def test_a_file_without_a_builder_entry_is_read_by_its_entries(tmp_path):
    space = _tiny_space()
    arch = tuple(n - 1 for n in space.num_options())
    old = save_checkpoint(
        tmp_path / "tier-1.pt",
        space_spec=space.spec,
        arrays=ArrayRecord(space.subnet(arch).state_dict()),
        stage="finetune",
        arch=list(arch),
    )
    assert builder_of(load_checkpoint(old)) == "subnet"
    x = torch.randn(5, *space.input_shape)
    _same_outputs(load_model(old), space.subnet(arch).eval(), x)
    net = build_prunable("convnet", num_classes=3, in_channels=1, input_height=8, input_width=8)
    gm = save_checkpoint(
        tmp_path / "gm0.pt", space_spec=net.spec, arrays=ArrayRecord(net.state_dict()), stage="x"
    )
    assert builder_of(load_checkpoint(gm)) == "prunable"
    _same_outputs(load_model(str(gm)), net.eval(), torch.randn(5, 1, 8, 8))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p, "no such file"),
        (lambda p: (p.write_bytes(b""), p)[1], "empty"),
        (lambda p: (p.write_bytes(b"\x80\x02not torch"), p)[1], "not a loadable checkpoint"),
        (lambda p: (torch.save({"x": torch.ones(1)}, p), p)[1], r"lacks the entries"),
        (
            lambda p: (torch.save({"cls": torch.nn.Linear(2, 2)}, p), p)[1],
            "not a loadable checkpoint",  # a pickled module: weights_only refuses it
        ),
        (lambda p: _subnet_file(p, builder="zzz"), r"'builder' = 'zzz'.*allowed: space, subnet"),
        (lambda p: _subnet_file(p, arch=[1, 1, 1, 1]), "weights do not fit its 'subnet'"),
        (lambda p: _subnet_file(p, arch=[1, 1, 1]), "cannot rebuild.*needs 4 option indices"),
        (
            lambda p: save_checkpoint(
                p,
                space_spec={"name": "nowhere"},
                arrays=ArrayRecord({"w": torch.ones(1)}),
                stage="final",
                builder="space",
            ),
            "cannot rebuild its 'space' module.*unknown search space 'nowhere'",
        ),
        (
            lambda p: save_checkpoint(
                p,
                space_spec=_tiny_space().spec,
                arrays=ArrayRecord(_tiny_space().state_dict()),
                stage="final",
                builder="derived",
            ),
            "without the entry 'genotype'",
        ),
        (lambda p: (p.with_suffix(".onnx").write_bytes(b"x"), p.with_suffix(".onnx"))[1], "ONNX"),
    ],
)
def test_a_file_it_cannot_rebuild_is_refused_naming_the_path_and_why(tmp_path, make, reason):
    path = make(tmp_path / "model.pt")
    with pytest.raises(ValueError, match=reason) as failure:
        load_model(path)
    assert str(path) in str(failure.value)


def test_prunable_weights_of_other_widths_are_refused(tmp_path):
    net = build_prunable("convnet", num_classes=3, in_channels=1, input_height=8, input_width=8)
    smaller = build_prunable(**{**net.spec, "widths": [w - 1 for w in net.widths]})
    path = save_checkpoint(
        tmp_path / "gm1.pt",
        space_spec=net.spec,
        arrays=ArrayRecord(smaller.state_dict()),
        stage="iterations",
        builder="prunable",
    )
    with pytest.raises(ValueError, match=r"gm1\.pt.*weights do not fit its 'prunable' module"):
        load_model(path)


#: method -> where its document lists its final models, and the files of the first model
#: and of its global-test accuracy's key
GLOBAL_MODELS = {
    "fedoras": ("models", "tier-1.pt", "global-test-accuracy"),
    "cfdnas": ("nets", "fdnas.pt", "global-test-accuracy"),
    "dpfnas": (None, "derived.pt", "global-test-accuracy"),
    "decnas": ("frontier", "gm-0.pt", "global-test-accuracy"),
    "fednas": (None, "derived.pt", "global-test-accuracy"),
}


@pytest.mark.parametrize("method", list(GLOBAL_MODELS))
def test_every_final_model_is_scored_on_the_server_s_global_test_set(runs, method):
    run = runs(method)
    listed, first_file, key = GLOBAL_MODELS[method]
    entries = [run.document] if listed is None else run.document[listed]
    assert entries
    for entry in entries:
        assert 0.0 <= entry[key] <= 1.0
        assert entry["global-test-count"] == GLOBAL_COUNT
    if method == "fedoras":  # per tier and per init
        assert {e["init"] for e in entries} == {"supernet", "random"}
    if method == "decnas":  # GM_T's tuned model too
        assert 0.0 <= entries[-1]["tuned-global-test-accuracy"] <= 1.0
    # the first model's figure, recomputed here: its file's module, BatchNorm statistics
    # re-estimated on the server's slice, scored in eval mode on the 450 digits
    data = load_global_test(run.settings.data)
    assert len(data) == GLOBAL_COUNT
    net = load_model(run.out_dir / first_file)
    refresh_batchnorm(net, load_server_data(run.settings.data))
    device = torch_device()  # where the runner scored it (refresh_batchnorm moved net there)
    expected = evaluate(net.to(device).eval(), ordered_loader(data), device)
    assert expected.count == GLOBAL_COUNT
    assert entries[0][key] == pytest.approx(expected.accuracy, abs=1e-9)
    # and the console's summary shows it
    text = "\n".join(summary_lines(method, snake_keys(run.document), run.settings.method_settings))
    assert "global test acc" in text


@pytest.mark.parametrize("method", ["dpfnas", "fednas"])
def test_a_darts_derived_net_s_cost_is_its_modules_forward_flops(runs, method):
    """DP-FNAS and FedNAS write the derived net's ``flops`` / ``macs`` (its path in the
    supernet: ``search_spaces.darts.genotype_cost``): torch's FLOP counter on the saved
    ``derived.pt``, one sample, gives the same figure."""
    from torch.utils.flop_counter import FlopCounterMode

    run = runs(method)
    net = load_model(run.out_dir / "derived.pt").eval()
    sample, _source = example_inputs(run.settings.data)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(sample[:1])
    assert run.document["flops"] == counter.get_total_flops() > 0
    assert run.document["macs"] == run.document["flops"] // 2
