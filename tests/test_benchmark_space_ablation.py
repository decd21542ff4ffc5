"""``benchmarks/space_ablation.py --quick`` as a smoke test (issue 40): the same ``cnn_s`` path
built with each head, trained by FedAvg for two short rounds at alpha 0.1, both scored on
the global test set; the table's nets are the ones it says (MACs near 0.56 M)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tests.test_benchmarks import load_benchmark, run_quick


@pytest.mark.slow
def test_space_ablation_quick_trains_each_head_of_one_path():
    saved = run_quick("space_ablation")
    head = saved["headline"]
    assert head["rows"] == 2 and head["seeds"] == 1
    runs = {run["settings"]["head"]: run for run in saved["runs"]}
    assert set(runs) == {"flatten", "gap"}
    for run in runs.values():
        assert run["settings"]["net"] == "cnn_s" and run["settings"]["alpha"] == 0.1
        assert 0.0 <= run["accuracy"] <= 1.0
        assert run["finite"] and math.isfinite(run["final_train_loss"])
        assert run["final_train_loss"] < math.log(10)  # below an untrained net's loss
        assert run["macs"] == pytest.approx(0.56e6, rel=0.05)
    # the flatten head's classifier reads C x H x W features: more MACs than GAP's, same path
    assert runs["flatten"]["macs"] > runs["gap"]["macs"]
    assert head["cnn_s_flatten"] == pytest.approx(runs["flatten"]["accuracy"], abs=1e-3)


MNIST = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}


def test_sampled_paths_are_distinct_nets_of_one_tiers_macs():
    ablation = load_benchmark("space_ablation")
    paths = [ablation.cnn_s_path(MNIST, 0.5, k) for k in range(5)]
    assert len(set(paths)) == 5
    for k in range(5):
        _, macs = ablation.build_net(ablation.Row("x", path=k, head="gap"), MNIST)
        assert macs == pytest.approx(ablation.TARGET_MACS, rel=0.1)
    with pytest.raises(ValueError, match="within 10%"):
        ablation.cnn_s_path(MNIST, 0.5, 500)


def test_mbconv_rows_are_five_distinct_nets_of_the_tiers_macs_with_fdnas_depth():
    from torch import nn

    ablation = load_benchmark("space_ablation")
    rows = [r for r in ablation.ROWS["mbconv"] if r.alpha == 0.1]
    built = [ablation.build_net(row, MNIST) for row in rows]
    assert len({net.arch for net, _ in built}) == 5
    for net, macs in built:
        assert macs == pytest.approx(ablation.TARGET_MACS, rel=0.1)
        assert len(net.arch) == 3 * ablation.MBCONV_LAYERS_PER_STAGE  # FDNAS's 12 layers
        assert any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    # the flatten rows train the same 5 paths with the flatten head: 32 channels x 4 x 4
    # into the classifier instead of 32, (512 - 32) x 10 more MACs
    flat_rows = [r for r in ablation.ROWS["mbconv-flatten"] if r.alpha == 0.1]
    assert [r.path for r in flat_rows] == [r.path for r in rows]
    for (gap, gap_macs), row in zip(built, flat_rows, strict=True):
        flat, flat_macs = ablation.build_net(row, MNIST)
        assert flat.arch == gap.arch
        assert flat_macs - gap_macs == (512 - 32) * 10
        assert [m.in_features for m in flat.modules() if isinstance(m, nn.Linear)] == [512]
    # the scaled rows: the flatten net with the classifier's input divided by sqrt(4 x 4)
    import torch

    scaled_row = next(r for r in ablation.ROWS["mbconv-scaled"] if r.alpha == 0.1)
    flat, _ = ablation.build_net(flat_rows[0], MNIST)
    scaled, scaled_macs = ablation.build_net(scaled_row, MNIST)
    assert scaled.arch == flat.arch and scaled_macs >= built[0][1]
    scaled.load_state_dict(flat.state_dict(), strict=False)  # its Linear under another name
    scaled.net.classifier.linear.load_state_dict(flat.net.classifier.state_dict())
    x = torch.randn(2, 1, 28, 28)
    features = []
    flat.net.classifier.register_forward_pre_hook(lambda m, i: features.append(i[0]))
    flat.eval()(x)
    torch.testing.assert_close(scaled.eval()(x), flat.net.classifier(features[0] / 4))
    with pytest.raises(ValueError, match="ConvNet rows: head"):  # scaled: allowed (below)
        ablation.build_net(ablation.Row("x", net="convnet", head="attention"), MNIST)
    # the space's BatchNorm: a row asking for another norm is refused, not ignored
    with pytest.raises(ValueError, match="mbconv rows: norm 'bn'"):
        ablation.build_net(ablation.Row("x", net="mbconv", width=0.25, norm="gn"), MNIST)
    with pytest.raises(ValueError, match="cnn_s, cnn_l, mbconv, darts, decnas-convnet"):
        ablation.build_net(ablation.Row("x", net="rnn"), MNIST)


@pytest.mark.parametrize(
    ("group", "layers"),
    [("mbconv-6-layers", 6), ("mbconv-3-layers", 3), ("cnn_l", 12), ("cnn_l-2-layers", 6)],
)
def test_space_groups_rows_are_five_flatten_nets_of_the_tiers_macs(group, layers):
    from torch import nn

    ablation = load_benchmark("space_ablation")
    rows = [r for r in ablation.ROWS[group] if r.alpha == 0.1]
    assert [r.path for r in rows] == list(range(5))
    built = [ablation.build_net(row, MNIST) for row in rows]
    assert len({net.arch for net, _ in built}) == 5
    for net, macs in built:
        assert len(net.arch) == layers
        assert macs == pytest.approx(ablation.TARGET_MACS, rel=0.12)  # + the flatten head's
        (linear,) = [m for m in net.modules() if isinstance(m, nn.Linear)]
        assert linear.in_features > 100  # the head's whole map, not GAP's channels
    if group == "cnn_l":  # the space's own norm and head choice only
        with pytest.raises(ValueError, match="cnn_l rows: norm 'bn'"):
            ablation.build_net(ablation.Row("x", net="cnn_l", width=0.1, norm="gn"), MNIST)
        with pytest.raises(ValueError, match="cnn_l rows: .* head of"):
            ablation.build_net(ablation.Row("x", net="cnn_l", head="flatten-scaled"), MNIST)


def test_mbconv_clip_group_is_the_6_layer_flatten_rows_clipped_at_5():
    ablation = load_benchmark("space_ablation")
    clipped = ablation.ROWS["mbconv-6-layers-clip"]
    plain = {
        r.label.removeprefix("mbconv flatten 6 layers "): r
        for r in ablation.ROWS["mbconv-6-layers"]
    }
    assert sorted({r.alpha for r in clipped}) == [0.0, 0.1, 1.0]
    for row in clipped:
        assert row.grad_clip == 5.0 and row.lr == 0.05 and row.head == "flatten"
        same = plain.get(row.label.removeprefix("mbconv flatten 6 layers clip 5 "))
        if same is not None:  # alpha 0.1 and 1.0: the unclipped rows' nets and data
            assert replace(row, label=same.label, grad_clip=0.0) == same
    iid = [r.label for r in clipped if r.alpha == 0.0]
    assert iid == [f"mbconv flatten 6 layers clip 5 path {k}, IID" for k in range(5)]


def test_most_filters_bisects_to_the_largest_width_that_fits():
    ablation = load_benchmark("space_ablation")
    assert ablation._most_filters(lambda w: w <= 7, 1, 16) == 7
    assert ablation._most_filters(lambda w: w <= 40, 1, 16) == 16
    assert ablation._most_filters(lambda w: w <= 3, 4, 16) is None
    assert ablation._most_filters(lambda w: True, 5, 4) is None  # an empty range


def test_decnas_rows_are_five_pruned_nets_of_the_tiers_macs_with_their_models_heads():
    """DecNAS's nets (issue 40 item 2): its ConvNet pruned along 5 seeded NetAdapt
    trajectories to within the tier's MACs, each layer keeping at least a quarter of its
    filters; the ConvNet's flatten classifier kept. (MobileNetV1: its first path, GAP.)"""
    from torch import nn

    from fedorasflwr.search_spaces.prunable import build_prunable

    ablation = load_benchmark("space_ablation")
    rows = [r for r in ablation.ROWS["decnas-convnet"] if r.alpha == 0.1]
    assert [r.path for r in rows] == list(range(5)) and {r.width for r in rows} == {0.25}
    base = build_prunable("convnet", **MNIST, width=0.25).widths
    built = [ablation.build_net(row, MNIST) for row in rows]
    assert len({net.widths for net, _ in built}) == 5  # distinct nets
    for net, macs in built:
        assert 0.9 * ablation.TARGET_MACS <= macs <= ablation.TARGET_MACS
        assert all(b // 4 <= w <= b for w, b in zip(net.widths, base, strict=True))
        assert net.widths != base and isinstance(net.model.classifier, nn.Linear)
        assert net.model.classifier.in_features > net.widths[-1]  # the flattened map
        assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    mobile = ablation.ROWS["decnas-mobilenet"][0]
    net, macs = ablation.build_net(mobile, MNIST)
    assert 0.9 * ablation.TARGET_MACS <= macs <= ablation.TARGET_MACS
    channels = net.widths[-1]
    assert net.model.classifier.in_features == channels  # GAP: one input a channel
    # the flatten group: the same pruned net, its classifier on the last 2 x 2 map
    flat = ablation.ROWS["decnas-mobilenet-flatten"][0]
    assert replace(flat, label=mobile.label, head="gap") == mobile
    flat_net, flat_macs = ablation.build_net(flat, MNIST)
    assert flat_net.classifier.in_features == channels * 2 * 2
    assert flat_macs - macs == (channels * 4 - channels) * 10  # the classifiers' MACs
    assert flat_net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    # the clip groups: the same rows, each local step's gradient clipped at norm 5
    for group, plain in (
        ("decnas-mobilenet-clip", mobile),
        ("decnas-mobilenet-flatten-clip", flat),
    ):
        clipped = ablation.ROWS[group][0]
        assert clipped.grad_clip == 5.0
        assert replace(clipped, label=plain.label, grad_clip=0.0) == plain
    # GroupNorm at a lower rate, BatchNorm at a higher one: the same pruned GAP nets at 0.1
    gn, fast = ablation.ROWS["decnas-mobilenet-gn"][0], ablation.ROWS["decnas-mobilenet-lr"][0]
    assert replace(gn, label=mobile.label, norm="bn", lr=0.05) == mobile
    assert replace(fast, label=mobile.label, lr=0.05) == mobile
    assert {r.alpha for r in ablation.ROWS["decnas-mobilenet-gn"]} == {0.1}
    gn_net, gn_macs = ablation.build_net(gn, MNIST)
    norms = [type(m) for m in gn_net.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    assert norms and set(norms) == {nn.GroupNorm}
    assert gn_net.widths == net.widths and gn_macs == macs  # the same net, its norms swapped
    assert gn_net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="decnas rows: convnet"):
        ablation.build_net(replace(rows[0], head="gap"), MNIST)
    with pytest.raises(ValueError, match="decnas rows: convnet"):
        ablation.build_net(replace(rows[0], norm="gn"), MNIST)  # the ConvNet: BatchNorm only


@pytest.mark.parametrize("depth", [6, 3])
def test_gap_depth_groups_train_the_flatten_groups_paths_with_the_gap_head(depth):
    from torch import nn

    ablation = load_benchmark("space_ablation")
    gap, flatten = (ablation.ROWS[f"mbconv-{depth}-layers{s}"] for s in ("-gap", ""))
    assert [r.alpha for r in gap] == [r.alpha for r in flatten]
    for g, f in zip(gap, flatten, strict=True):
        (gap_net, _), (flatten_net, _) = ablation.build_net(g, MNIST), ablation.build_net(f, MNIST)
        assert gap_net.arch == flatten_net.arch and len(gap_net.arch) == depth
        (linear,) = [m for m in gap_net.modules() if isinstance(m, nn.Linear)]
        assert linear.in_features < 100  # GAP's channels, not the whole map


def test_mbconv_central_rows_train_the_flatten_and_gap_rows_paths_on_pooled_data():
    ablation = load_benchmark("space_ablation")
    rows = ablation.ROWS["mbconv-central"]
    assert all(r.central and r.net == "mbconv" for r in rows)
    for head, group in (("flatten", "mbconv-flatten"), ("gap", "mbconv")):
        central = [ablation.build_net(r, MNIST)[0].arch for r in rows if r.head == head]
        federated = [r for r in ablation.ROWS[group] if r.alpha == 0.1]
        assert central == [ablation.build_net(r, MNIST)[0].arch for r in federated]


def test_decnas_mobilenet_depth_rows_are_mobilenets_of_the_tiers_macs_at_two_depths():
    from torch import nn

    ablation = load_benchmark("space_ablation")
    rows = ablation.ROWS["decnas-mobilenet-depth"]
    assert {(r.net, r.alpha) for r in rows} == {
        (net, alpha) for net in ablation.MOBILENET_DEPTHS for alpha in (0.1, 1.0)
    }
    convolutions = {}
    for row in rows[:2]:
        torch.manual_seed(0)
        net, macs = ablation.build_net(row, MNIST)
        torch.manual_seed(0)
        again, _ = ablation.build_net(row, MNIST)
        for a, b in zip(net.state_dict().values(), again.state_dict().values(), strict=True):
            assert torch.equal(a, b)  # the seed initialises the net, not the width search
        assert abs(macs - ablation.TARGET_MACS) < 0.05 * ablation.TARGET_MACS
        convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
        norms = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
        assert len(norms) == len(convs)
        assert net.classifier.in_features == convs[-1].out_channels  # GAP
        convolutions[row.net] = len(convs)
        assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert convolutions == {"mobilenet-narrow": 27, "mobilenet-shallow": 9}
    # the flatten group: the 4 blocks' GAP net, its classifier on the last 4 x 4 map
    flat = ablation.ROWS["decnas-mobilenet-depth-flatten"]
    assert [replace(r, label=rows[1].label, head="gap") for r in flat[:1]] == [rows[1]]
    torch.manual_seed(0)
    gap_net, _ = ablation.build_net(rows[1], MNIST)
    flat_net, flat_macs = ablation.build_net(flat[0], MNIST)
    assert flat_net.classifier.in_features == gap_net.classifier.in_features * 4 * 4
    assert abs(flat_macs - ablation.TARGET_MACS) < 0.05 * ablation.TARGET_MACS
    with pytest.raises(ValueError, match="mobilenet-shallow rows"):
        ablation.build_net(replace(rows[1], head="flatten-scaled"), MNIST)


def test_decnas_mobilenet_central_rows_train_the_federated_rows_nets_on_pooled_data():
    ablation = load_benchmark("space_ablation")
    rows = ablation.ROWS["decnas-mobilenet-central"]
    assert all(r.central and r.net == "decnas-mobilenet" for r in rows)
    for head, group in (("gap", "decnas-mobilenet"), ("flatten", "decnas-mobilenet-flatten")):
        central = [r for r in rows if r.head == head]
        federated = [r for r in ablation.ROWS[group] if r.alpha == 0.1]
        assert len(central) == len(federated) == 5
        for c, f in zip(central, federated, strict=True):  # the nets build_net makes of them
            assert replace(c, label=f.label, central=False, alpha=f.alpha) == f
    # the headline sets them against the ConvNet trained centrally, under their own keys
    table = {"ConvNet flatten, centralised": {"mean": 0.98, "by_seed": {0: 0.98}}}
    for k, accuracy in enumerate((0.90, 0.95, 0.97, 0.93, 0.99)):
        label = f"decnas MobileNetV1 pruned path {k}, centralised"
        table[label] = {"mean": accuracy, "by_seed": {0: accuracy}}
    assert ablation.gaps_pp(table) == {
        "decnas_mobilenet_central_seeds": 1,
        "decnas_mobilenet_central_best_pp": 1.0,
        "decnas_mobilenet_central_median_pp": -3.0,
    }


def test_darts_rows_are_five_derived_nets_of_the_tiers_macs_as_dpfnas_builds_them():
    """The darts groups train 5 distinct genotypes' derived nets within 10% of the tier's
    MACs, built as DP-FNAS / FedNAS build theirs at the default width and depth (GroupNorm,
    no BatchNorm, GAP); the lr group the same nets at its rate; a BatchNorm darts row is
    refused."""
    from torch import nn

    from fedorasflwr.config import parse_run_config, space_kwargs
    from fedorasflwr.data import dataset_info
    from fedorasflwr.search_spaces import build_space
    from fedorasflwr.search_spaces.base import _count_flops
    from fedorasflwr.search_spaces.darts import DartsSpace
    from tests.runconfig import pyproject_run_config

    ablation = load_benchmark("space_ablation")
    rows = [r for r in ablation.ROWS["darts"] if r.alpha == 0.1]
    nets = [ablation.build_net(row, MNIST) for row in rows]
    assert len({net.genotype for net, _ in nets}) == 5
    settings = parse_run_config({**pyproject_run_config(), "method": "dpfnas"})
    gap = replace(settings.space, name="darts", head="gap")  # DARTS's, as the rows were drawn
    kwargs = space_kwargs(gap, dataset_info(settings.data))
    assert ablation.darts_spec(MNIST, settings.space.width) == dict(build_space(**kwargs).spec)
    for net, macs in nets:
        assert macs == pytest.approx(ablation.TARGET_MACS, rel=0.1)
        assert any(isinstance(m, nn.GroupNorm) for m in net.modules())
        assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    slower = [r for r in ablation.ROWS["darts-lr"] if r.alpha == 0.1]
    assert [r.lr for r in slower] == [0.025] * 5 and [r.lr for r in rows] == [0.05] * 5
    assert {r.grad_clip for r in rows + slower} == {0.0}
    assert [ablation.build_net(r, MNIST)[0].genotype for r in slower] == [
        n.genotype for n, _ in nets
    ]
    with pytest.raises(ValueError, match="darts rows: norm 'gn', head of"):
        ablation.build_net(replace(rows[0], norm="bn"), MNIST)
    # the flatten groups: the same genotypes, the cells and stem kept, a classifier on the
    # last cell's flattened map (64 channels x 4 x 4 here), a few more MACs than GAP's
    # (the clip group: the methods' lr with DARTS's gradient clipping; the others none)
    for group, lr, clip in (
        ("darts-flatten", 0.05, 0.0),
        ("darts-flatten-lr", 0.025, 0.0),
        ("darts-flatten-clip", 0.05, 5.0),
    ):
        flat = [r for r in ablation.ROWS[group] if r.alpha == 0.1]
        assert [r.lr for r in flat] == [lr] * 5 and {r.head for r in flat} == {"flatten"}
        assert {r.grad_clip for r in flat} == {clip}
        for row, (gap_net, gap_macs) in zip(flat, nets, strict=True):
            net, macs = ablation.build_net(row, MNIST)
            assert net.classifier.in_features == 64 * 4 * 4
            assert repr(net.cells) == repr(gap_net.cells)  # the genotype's cells
            assert macs - gap_macs == 64 * 4 * 4 * 10 - 64 * 10  # the classifiers' MACs
            assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
            # the space's own flatten head builds this net: same modules, same weights' shapes
            spec = {**ablation.darts_spec(MNIST, row.width), "head": "flatten"}
            library = DartsSpace.derived_network(gap_net.genotype.to_text(), **spec)
            shapes = {k: v.shape for k, v in library.state_dict().items()}
            assert {k: v.shape for k, v in net.state_dict().items()} == shapes
            assert _count_flops(library, torch.zeros(1, 1, 28, 28)) // 2 == macs
    # the clip group has IID rows too, labelled as gaps_pp reads them against the ConvNet's
    clip_rows = ablation.ROWS["darts-flatten-clip"]
    assert sorted({r.alpha for r in clip_rows}) == [0.0, 0.1, 1.0]
    iid = [r.label for r in clip_rows if r.alpha == 0.0]
    assert iid == [f"darts derived flatten clip 5 path {k}, IID" for k in range(5)]
    assert ablation.GAPS["iid"][0].endswith(", IID")
    # 2 cells at width 0.75: the run config's darts space with space.layers-per-block = 2
    shallow = ablation.ROWS["darts-2-cells-flatten-clip"]
    assert {(r.head, r.grad_clip, r.lr, r.width, r.alpha) for r in shallow} == {
        ("flatten", 5.0, 0.05, 0.75, 1.0)
    }
    two = parse_run_config(
        {**pyproject_run_config(), "method": "dpfnas", "space.layers-per-block": 2}
    )
    shallow_space = replace(two.space, name="darts", head="gap", width=0.75)
    kwargs = space_kwargs(shallow_space, dataset_info(two.data))
    assert ablation.darts_spec(MNIST, 0.75, cells=2) == dict(build_space(**kwargs).spec)
    shallow_nets = [ablation.build_net(row, MNIST) for row in shallow]
    assert len({repr(net.cells) for net, _ in shallow_nets}) == 5  # 5 genotypes' cells
    for net, macs in shallow_nets:
        assert len(net.cells) == 2 and net.classifier.in_features > 100  # flattened
        assert macs == pytest.approx(ablation.TARGET_MACS, rel=0.12)


def test_a_rows_grad_clip_and_weight_decay_reach_every_local_step(monkeypatch):
    """A row's ``grad_clip`` and ``weight_decay`` are the ``grad-clip`` and ``weight-decay``
    of each client's local SGD (the package's clipping, tested on a hand-computed step in
    tests/test_grad_clip.py; the decay is torch's SGD's)."""
    from fedorasflwr import training

    ablation = load_benchmark("space_ablation")
    real, seen = training.local_sgd, []

    def spy(net, dataset, config, words):
        seen.append((config["grad-clip"], config["weight-decay"]))
        return real(net, dataset, config, words)

    monkeypatch.setattr(training, "local_sgd", spy)
    row = ablation.ROWS["darts-flatten-clip-wd"][0]
    # the decay group: the clip group's alpha 1.0 rows with DARTS's weight decay
    plain = [r for r in ablation.ROWS["darts-flatten-clip"] if r.alpha == 1.0][0]
    assert replace(row, label=plain.label, weight_decay=0.0) == plain
    short = replace(row, rounds=1, clients_per_round=2, local_epochs=1)
    run = ablation.train_row(short, 0)
    assert seen == [(5.0, 3e-4)] * 2 and run["settings"]["grad_clip"] == 5.0
    assert run["settings"]["weight_decay"] == 3e-4
    assert run["finite"]


def test_alphas_picks_rows_and_refuses_a_choice_that_leaves_none(capsys):
    ablation = load_benchmark("space_ablation")
    with pytest.raises(SystemExit) as refused:  # before any data or training
        ablation.main(["--rows", "mbconv-central", "--alphas", "1.0"])
    assert refused.value.code == 2
    assert "--alphas [1.0]: none of the rows of ['mbconv-central']" in capsys.readouterr().err


def test_a_rows_reduction_builds_the_same_path_with_its_reduction():
    from torch import nn

    ablation = load_benchmark("space_ablation")
    paper, paper_macs = ablation.build_net(ablation.Row("x"), MNIST)
    pooled, pooled_macs = ablation.build_net(ablation.Row("y", reduction="maxpool-conv1x1"), MNIST)
    assert paper.arch == pooled.arch  # the same recorded path
    assert any(isinstance(m, nn.AvgPool2d) for m in paper.modules())
    assert not any(isinstance(m, nn.AvgPool2d) for m in pooled.modules())
    assert any(isinstance(m, nn.MaxPool2d) for m in pooled.modules())
    # its conv1x1s run on a quarter of the positions (by hand: tests/search_spaces/test_reductions)
    assert paper_macs - pooled_macs == 28 * 28 * 8 * 12 + 14 * 14 * 12 * 18 + 7 * 7 * 18 * 28 - (
        14 * 14 * 8 * 12 + 7 * 7 * 12 * 18 + 4 * 4 * 18 * 28
    )


def test_the_scaled_convnet_divides_its_classifiers_input_by_the_maps_positions():
    """The ``scaled-head`` group's ConvNet: the flatten row's net (same width, MACs and
    weights from the same seed), its classifier reading the map / sqrt(H x W)."""
    ablation = load_benchmark("space_ablation")
    rows = {row.label: row for row in ablation.ROWS["scaled-head"]}
    assert {(r.head, r.dataset, r.lr) for r in rows.values() if r.dataset == "shapes"} == {
        ("flatten", "shapes", 0.05),
        ("flatten-scaled", "shapes", 0.05),
        ("flatten-scaled", "shapes", ablation._SHAPES_LR),
    }
    torch.manual_seed(0)
    plain, plain_macs = ablation.build_net(ablation.Row("x", net="convnet"), MNIST)
    torch.manual_seed(0)
    scaled, scaled_macs = ablation.build_net(
        ablation.Row("y", net="convnet", head="flatten-scaled"), MNIST
    )
    assert scaled_macs == plain_macs
    full = list(ablation.ROWS["scaled-head-full"])
    assert [(r.net, r.head, r.dataset, r.alpha, r.lr) for r in full] == [
        ("convnet-full", head, data, alpha, 0.05)
        for data, alpha in (("shapes", 1.0), ("mnist5k", 0.1))
        for head in ("flatten", "flatten-scaled")
    ]
    wide, _ = ablation.build_net(full[1], MNIST)  # width 1: 128 x 3 x 3 inputs, / 3
    # the package's ConvNet head (prunable_nets.ConvNet): MNIST's 28 x 28 ends at 3 x 3
    assert wide.classifier.in_features == 128 * 9 and wide.head_scale == pytest.approx(1 / 3)
    assert scaled.head == "flatten-scaled" and plain.head == "flatten"
    assert torch.equal(scaled.classifier.weight, plain.classifier.weight)
    x = torch.randn(2, 1, 28, 28)
    scaled.eval(), plain.eval()
    bias = plain.classifier.bias
    torch.testing.assert_close((scaled(x) - bias) * 3, plain(x) - bias)


def test_the_scaled_darts_rows_are_the_clipped_flatten_rows_nets_reading_a_quarter():
    """``darts-flatten-scaled`` (and its clipped twin) train the clipped flatten rows' path 0
    net (same genotype, MACs and weights from the same seed) with the classifier's input
    divided by sqrt(4 x 4), the last cell's map on MNIST."""
    ablation = load_benchmark("space_ablation")
    (flat_row,) = [r for r in ablation.ROWS["darts-flatten-clip"] if (r.path, r.alpha) == (0, 1.0)]
    scaled_row, clipped_row = (
        next(r for r in ablation.ROWS[g] if (r.path, r.alpha) == (0, 1.0))
        for g in ("darts-flatten-scaled", "darts-flatten-scaled-clip")
    )
    assert (scaled_row.grad_clip, clipped_row.grad_clip) == (0.0, 5.0)
    assert replace(clipped_row, label="", head="flatten") == replace(flat_row, label="")
    ablation.build_net(flat_row, MNIST)  # the 100 genotype draws, cached (they build nets)
    torch.manual_seed(0)
    flat, flat_macs = ablation.build_net(flat_row, MNIST)
    torch.manual_seed(0)
    scaled, scaled_macs = ablation.build_net(scaled_row, MNIST)
    assert scaled_macs == flat_macs
    renamed = {
        k.replace("classifier.linear.", "classifier."): v for k, v in scaled.state_dict().items()
    }
    assert renamed.keys() == flat.state_dict().keys()
    assert all(torch.equal(v, flat.state_dict()[k]) for k, v in renamed.items())
    x = torch.randn(2, 1, 28, 28)
    features = flat.features(x)
    assert features.shape[1] == 64 * 4 * 4
    torch.testing.assert_close(scaled(x), flat.classifier(features / 4))


def test_a_rerun_replaces_only_its_own_rows_and_seeds():
    ablation = load_benchmark("space_ablation")
    recorded = [{"row": "a", "seed": 0, "accuracy": 0.1}, {"row": "a", "seed": 1, "accuracy": 0.2}]
    recorded.append({"row": "b", "seed": 0, "accuracy": 0.3})
    merged = ablation.merge_runs(recorded, [{"row": "a", "seed": 1, "accuracy": 0.9}])
    assert [(r["row"], r["seed"], r["accuracy"]) for r in merged] == [
        ("a", 0, 0.1),
        ("b", 0, 0.3),
        ("a", 1, 0.9),
    ]


def test_gaps_to_the_convnet_hand_computed():
    ablation = load_benchmark("space_ablation")
    table = {
        "cnn_s flatten, alpha 0.1": {"mean": 0.90},
        "ConvNet flatten, alpha 0.1": {"mean": 0.93},
        "cnn_s flatten, IID": {"mean": 0.95},  # no IID ConvNet: no IID gap
    }
    for k, mean in enumerate((0.80, 0.96, 0.85, 0.91), start=1):
        table[f"cnn_s flatten path {k}, alpha 0.1"] = {"mean": mean}
    # sorted: 0.80 0.85 0.90 0.91 0.96 -> best 0.96, median 0.90; minus 0.93
    assert ablation.gaps_pp(table) == {
        "gap_pp_alpha_0.1": -3.0,
        "paths_alpha_0.1_best_pp": 3.0,
        "paths_alpha_0.1_median_pp": -3.0,
    }


def test_mbconv_gaps_to_the_convnet_hand_computed():
    ablation = load_benchmark("space_ablation")
    table = {"ConvNet flatten, alpha 1.0": {"mean": 0.97, "by_seed": {0: 0.96, 1: 0.98}}}
    for k, (a, b) in enumerate(
        ((0.90, 0.92), (0.95, 0.97), (0.80, 0.90), (0.93, 0.93), (0.99, 0.97))
    ):
        table[f"mbconv path {k}, alpha 1.0"] = {"mean": (a + b) / 2, "by_seed": {0: a, 1: b}}
    # means 0.91 0.96 0.85 0.93 0.98 -> best 0.98, median 0.93; minus 0.97
    assert ablation.gaps_pp(table) == {
        "mbconv_alpha_1.0_seeds": 2,
        "mbconv_alpha_1.0_best_pp": 1.0,
        "mbconv_alpha_1.0_median_pp": -4.0,
    }
    # the flatten rows give their own keys from their own five
    for k, accuracy in enumerate((0.97, 0.96, 0.95, 0.94, 0.93)):
        table[f"mbconv flatten path {k}, alpha 1.0"] = {"mean": accuracy, "by_seed": {1: accuracy}}
    assert ablation.gaps_pp(table) == {
        "mbconv_alpha_1.0_seeds": 2,
        "mbconv_alpha_1.0_best_pp": 1.0,
        "mbconv_alpha_1.0_median_pp": -4.0,
        "mbconv_flatten_alpha_1.0_seeds": 1,  # seed 1 only: against the ConvNet's 0.98
        "mbconv_flatten_alpha_1.0_best_pp": -1.0,
        "mbconv_flatten_alpha_1.0_median_pp": -3.0,
    }
    # the central rows against the ConvNet trained centrally, under their own setting
    table["ConvNet flatten, centralised"] = {"mean": 0.98, "by_seed": {0: 0.98}}
    for k, accuracy in enumerate((0.97, 0.99, 0.95, 0.90, 0.96)):
        table[f"mbconv flatten path {k}, centralised"] = {
            "mean": accuracy,
            "by_seed": {0: accuracy},
        }
    central = ablation.gaps_pp(table)
    assert {k: v for k, v in central.items() if "central" in k} == {
        "mbconv_flatten_central_seeds": 1,
        "mbconv_flatten_central_best_pp": 1.0,
        "mbconv_flatten_central_median_pp": -2.0,
    }
    del table["ConvNet flatten, centralised"]
    del table["mbconv path 4, alpha 1.0"]  # not all five: no figure
    del table["mbconv flatten path 0, alpha 1.0"]
    assert ablation.gaps_pp(table) == {}


def test_paths_against_the_convnet_over_the_seeds_all_ran():
    """A path run at seed 0 only is set against the ConvNet's seed 0, not its 3-seed mean."""
    ablation = load_benchmark("space_ablation")
    table = {
        "cnn_s flatten, alpha 0.1": {"mean": 0.90, "by_seed": {0: 0.92, 1: 0.86, 2: 0.92}},
        "ConvNet flatten, alpha 0.1": {"mean": 0.93, "by_seed": {0: 0.95, 1: 0.88, 2: 0.96}},
    }
    for k, accuracy in enumerate((0.80, 0.96, 0.85, 0.91), start=1):
        table[f"cnn_s flatten path {k}, alpha 0.1"] = {
            "mean": accuracy,
            "by_seed": {0: accuracy},
        }
    # seed 0: 0.80 0.85 0.91 0.92 0.96 -> best 0.96, median 0.91; minus the ConvNet's 0.95
    assert ablation.gaps_pp(table) == {
        "gap_pp_alpha_0.1": -3.0,
        "paths_alpha_0.1_seeds": 1,
        "paths_alpha_0.1_best_pp": 1.0,
        "paths_alpha_0.1_median_pp": -4.0,
    }


def test_every_gap_names_rows_of_the_table():
    ablation = load_benchmark("space_ablation")
    labels = {row.label for rows in ablation.ROWS.values() for row in rows}
    assert {label for pair in ablation.GAPS.values() for label in pair} <= labels
    # every row reduction_gaps_pp reads is a row of the table: all of them give all gaps
    table = {label: {"mean": 0.5} for label in labels}
    gaps = ablation.reduction_gaps_pp(table)
    assert len(gaps) == 6 and set(gaps.values()) == {0.0}


def test_reduction_gaps_hand_computed():
    ablation = load_benchmark("space_ablation")
    table = {
        "ConvNet flatten, shapes, centralised": {"mean": 0.90},
        "ConvNet flatten, shapes, alpha 1.0": {"mean": 0.60},
        "cnn_s maxpool-conv1x1, shapes, alpha 1.0": {"mean": 0.57},
    }
    for k, mean in enumerate((0.80, 0.96, 0.85, 0.91, 0.70)):
        table[f"cnn_s path {k}, maxpool-conv1x1, shapes, centralised"] = {"mean": mean}
    for k in range(4):  # one path of the paper's reduction missing: no gap for it
        table[f"cnn_s path {k}, conv1x1-avgpool, shapes, centralised"] = {"mean": 0.3}
    # sorted: 0.70 0.80 0.85 0.91 0.96 -> best 0.96, median 0.85; minus 0.90
    assert ablation.reduction_gaps_pp(table) == {
        "shapes_central_maxpool-conv1x1_best_pp": 6.0,
        "shapes_central_maxpool-conv1x1_median_pp": -5.0,
        "shapes_alpha_1.0_maxpool-conv1x1_pp": -3.0,
    }
