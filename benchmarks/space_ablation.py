"""Why FedorAS's nets lost to hand-made ones (issue 40): one net, trained by FedAvg, per factor.

Each row trains one fixed network federatedly from scratch with one recipe (the issue's:
MNIST-5k, 20 clients, Dirichlet ``alpha``, 10 clients per round, 2 local epochs, SGD
lr 0.05 momentum 0.9, batch 32) and scores it on the global test set after re-estimating
its BatchNorm statistics on the server slice (what every run reports). The networks:

- ``cnn_s``: one fixed path of the FedorAS ``cnn_s`` space (width 0.5, the default run's
  space), the seeded path whose MACs are nearest 0.56 M, built with each ``head``
  (``flatten``: the project's default since issue 40; ``gap``: the paper's global average
  pooling), each normalisation (``bn``; ``gn``: GroupNorm, 2 groups, the DP-safe choice;
  ``none``) and width;
- ``mbconv``: 5 seeded paths of FDNAS / CFDNAS's space (12 searchable layers, 0.4.0's default) at
  width 0.25, of the same MACs, with the paper's GAP head (row group ``mbconv``; headline
  ``mbconv_<setting>_best_pp`` / ``_median_pp`` against the ConvNet) and the same paths
  with the space's flatten head (``mbconv-flatten``; ``mbconv_flatten_<setting>_...``) and
  with that head's input divided by sqrt(H x W) (``mbconv-scaled``; ``mbconv_scaled_...``);
  the flatten head on shallower, wider spaces of the same MACs (``mbconv-6-layers``: 2
  layers a stage at width 0.5; ``mbconv-3-layers``: 1 at width 0.75) and each with the
  GAP head (``mbconv-6-layers-gap``, ``mbconv-3-layers-gap``); the 6-layer flatten paths
  with each local step's gradient clipped at norm 5 (``mbconv-6-layers-clip``, FDNAS's
  default since; also IID); and the default depth's paths with either head trained on the
  pooled data (``mbconv-central``);
- ``cnn_l``: 5 seeded paths of FedorAS's CIFAR space at its default depth (3 blocks of 4
  layers) and flatten head, at width 0.1, where its paths reach the tier's MACs on MNIST
  (row group ``cnn_l``, headline ``cnn_l_<setting>_...``), and with 2 layers a block at the
  same width (``cnn_l-2-layers``: 6 searchable layers);
- ``darts``: the derived nets of 5 genotypes of seeded random alphas of DP-FNAS / FedNAS's
  space at the methods' defaults (width 0.5: C = 4, 4 cells; GroupNorm and GAP as the space
  has them, so no BatchNorm to re-estimate), of the same MACs, at the methods' final-lr 0.05
  (row group ``darts``, headline ``darts_<setting>_...``) and at 0.025 (``darts-lr``);
  the same nets with a classifier on the last cell's flattened map instead of GAP (built
  here, not by the space: ``darts-flatten`` at 0.05, ``darts-flatten-lr`` at 0.025,
  ``darts-flatten-clip`` at 0.05 with DARTS's gradient clipping, max norm 5), those with 2
  cells at width 0.75 (``darts-2-cells-flatten-clip``), with DARTS's weight decay 3e-4
  (``darts-flatten-clip-wd``), and with the flatten head's input divided by sqrt(H x W),
  unclipped and clipped (``darts-flatten-scaled``, ``darts-flatten-scaled-clip``);
- ``decnas-convnet`` / ``decnas-mobilenet``: DecNAS's two built-in models at width 0.25
  pruned to the same MACs along 5 seeded random NetAdapt trajectories (``decnas_widths``),
  each with its model's head (the ConvNet's flatten classifier, MobileNetV1's GAP), and the
  MobileNetV1 nets with a flatten classifier (``decnas-mobilenet-flatten``), and both heads'
  MobileNetV1 nets with each local step's gradient clipped at norm 5
  (``decnas-mobilenet-clip``, ``decnas-mobilenet-flatten-clip``), with GroupNorm at lr 0.025
  (``decnas-mobilenet-gn``) and at lr 0.1 (``decnas-mobilenet-lr``); MobileNetV1 unpruned at
  one narrow width, whole and with 4 of its 13 blocks (``decnas-mobilenet-depth``), and the
  4 blocks with a flatten classifier (``decnas-mobilenet-depth-flatten``);
- ``convnet``: the width baselines' hand-made ConvNet (HeteroFL / FjORD) at the width whose
  MACs are nearest the ``cnn_s`` path's, with its flatten head or a GAP head, or with the
  flatten head's input divided by sqrt(H x W) (``scaled-head``: on the shapes folder at the
  presets' lr 0.05 and at 0.0125, and on MNIST-5k; ``scaled-head-full``: ``convnet-full``,
  the baselines' full model at width 1, with either head on shapes at 0.05);
- ``central``: the same nets trained on all clients' training data pooled (the control that
  says whether a net is bad, or only slow under FedAvg);
- ``reduction`` / ``reduction-federated``: the ``cnn_s`` reduction (``space.reduction``), the
  paper's (conv1x1, then average pooling: every other row's) against max pooling first, on
  the shapes folder (a row's ``dataset``: ``shapes``, written once under ``outputs/`` by
  ``lr_stability.shapes_folder``; lr 0.0125) and on MNIST-5k.

Every factor is one change from the default row, so a row's gap to its reference is that
factor's share. ``--seeds`` runs each row once per seed (data split, sampling, init);
the table prints the mean and the spread.

    python benchmarks/space_ablation.py                 # every row, seed 0 (not yet timed)
    python benchmarks/space_ablation.py --rows head --seeds 0 1 2   # 12 runs: 30 min on 2 cores
    python benchmarks/space_ablation.py --rows head     # only some rows (see ROWS)
    python benchmarks/space_ablation.py --rows mbconv-3-layers --alphas 0.1 --seeds 0 1 2
    python benchmarks/space_ablation.py --quick         # smoke: 2 rounds, two rows, one seed

Writes ``benchmarks/results/space_ablation.json`` (``.quick.json``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from common import ROOT, report, warm_data_cache

sys.path.insert(0, str(ROOT))

from fedorasflwr.search_spaces.cnn import HEADS, PAPER_REDUCTION, REDUCTIONS  # noqa: E402
from fedorasflwr.search_spaces.prunable_nets import MobileNetV1  # noqa: E402

NUM_CLIENTS = 20
TARGET_MACS = 0.56e6  # the T1 net
#: mbconv rows: 0.4.0's default depth (``space.layers-per-block`` 4: 12 searchable layers;
#: "auto", the default since, gives 2: the ``mbconv-6-layers`` groups' space)
MBCONV_LAYERS_PER_STAGE = 4


@dataclass(frozen=True)
class Row:
    """One trained network: which net, its head, normalisation and width, and the recipe."""

    label: str
    net: str = "cnn_s"  # cnn_s | mbconv (FDNAS's space) | cnn_l (FedorAS's CIFAR one) | convnet
    #   | convnet-full (the width baselines' full model, width 1)
    #   | decnas-convnet / decnas-mobilenet (DecNAS's pruned nets of its two built-in models)
    head: str = "flatten"  # flatten | gap | flatten-scaled (mbconv, convnet: / sqrt(H x W))
    reduction: str = PAPER_REDUCTION  # cnn_s: what every row before the choice ran
    norm: str = "bn"  # bn | gn | none (cnn_s only)
    width: float = 0.5  # the space's width (cnn_s, mbconv, cnn_l)
    # mbconv: 3 x this searchable layers; cnn_l: layers a block; darts: cells (4: as before)
    layers_per_stage: int = MBCONV_LAYERS_PER_STAGE
    path: int = 0  # a space's: 0 = the path nearest TARGET_MACS, k = the k-th next within 10%
    alpha: float = 0.1  # Dirichlet concentration; 0: IID
    lr: float = 0.05
    grad_clip: float = 0.0  # each local step's gradient scaled to this L2 norm at most; 0: off
    weight_decay: float = 0.0  # the local SGD's L2 penalty
    central: bool = False  # pooled training data, same SGD steps per epoch budget
    rounds: int = 30
    clients_per_round: int = 10
    local_epochs: int = 2
    dataset: str = "mnist5k"  # or "shapes": the shapes folder (300 a class, seed 0)


_SHAPES_LR = 0.0125
_CENTRAL_SHAPES = {
    "dataset": "shapes",
    "central": True,
    "rounds": 10,
    "lr": _SHAPES_LR,
    "alpha": 0.0,
}
_FEDERATED_SHAPES = {"dataset": "shapes", "lr": _SHAPES_LR, "alpha": 1.0}


@dataclass(frozen=True)
class SpaceGroup:
    """A row group of 5 seeded paths of the tier's MACs of one space (``net``: ``mbconv``,
    ``cnn_l`` or ``darts``): the rows' label, head, headline prefix, depth (mbconv's
    ``layers_per_stage``: 3 x this searchable layers), width (the one at that depth whose
    seeded paths are near TARGET_MACS), normalisation, learning rate, gradient clipping
    (``Row.grad_clip``) and the data settings it has rows of (``alphas``; 0: IID)."""

    label: str
    head: str
    prefix: str
    layers_per_stage: int = MBCONV_LAYERS_PER_STAGE
    width: float = 0.25
    net: str = "mbconv"
    norm: str = "bn"
    lr: float = 0.05
    grad_clip: float = 0.0
    alphas: tuple[float, ...] = (0.1, 1.0)  # the data settings it has rows of (0: IID)
    weight_decay: float = 0.0


#: the row groups of 5 sampled paths. ``mbconv``: the paper's GAP head (the space's default);
#: ``mbconv-flatten``: ``space.head = "flatten"``; ``mbconv-scaled``: that head's input
#: divided by sqrt(H x W) (4 here), so the classifier's logit steps are about GAP's size
#: with the map's layout kept (benchmark only); ``mbconv-6-layers`` / ``mbconv-3-layers``:
#: the flatten head on a shallower, wider space of the same MACs (``space.layers-per-block``
#: 2 at width 0.5, 1 at width 0.75: is FDNAS's depth what trains slowly under FedAvg?) and
#: each depth with the paper's GAP head (``mbconv-6-layers-gap``, ``mbconv-3-layers-gap``),
#: and the 6-layer flatten space with gradient clipping (``mbconv-6-layers-clip``, alpha 0.1,
#: 1.0 and IID); ``cnn_l``: below
SPACE_GROUPS = {
    "mbconv": SpaceGroup("mbconv", "gap", "mbconv"),
    "mbconv-flatten": SpaceGroup("mbconv flatten", "flatten", "mbconv_flatten"),
    "mbconv-scaled": SpaceGroup("mbconv flatten-scaled", "flatten-scaled", "mbconv_scaled"),
    "mbconv-6-layers": SpaceGroup("mbconv flatten 6 layers", "flatten", "mbconv_6_layers", 2, 0.5),
    "mbconv-6-layers-gap": SpaceGroup("mbconv 6 layers", "gap", "mbconv_6_layers_gap", 2, 0.5),
    "mbconv-3-layers": SpaceGroup("mbconv flatten 3 layers", "flatten", "mbconv_3_layers", 1, 0.75),
    "mbconv-3-layers-gap": SpaceGroup("mbconv 3 layers", "gap", "mbconv_3_layers_gap", 1, 0.75),
    # the 6-layer flatten space with DARTS's gradient clipping (max norm 5) at FDNAS's lr:
    # the flatten head diverged in CFDNAS's class-group preset without it, and a clipped
    # run did not (preset_variants.py); does the clip cost these nets anything?
    "mbconv-6-layers-clip": SpaceGroup(
        "mbconv flatten 6 layers clip 5",
        "flatten",
        "mbconv_6_layers_clip",
        2,
        0.5,
        grad_clip=5.0,
        alphas=(0.1, 1.0, 0.0),
    ),
    # cnn_l (FedorAS's CIFAR space) at its default depth (3 blocks of 4 layers) and the
    # width (0.1) where its seeded paths reach the tier's MACs on MNIST, its default head
    "cnn_l": SpaceGroup(
        "cnn_l flatten", "flatten", "cnn_l", width=0.1, net="cnn_l", alphas=(0.1, 1.0, 0.0)
    ),
    # cnn_l with 2 layers a block (6 searchable layers), the same width: at 4 its median path
    # at alpha 1.0 was 2.3 pp below the ConvNet (goal: 2), and mbconv's 12 layers trained
    # slower than its 6 at the same MACs; here the seeded paths of the tier's MACs are typical
    # ones (the median of 500 is 0.62 MMACs; at 4 layers a block, 1.13)
    "cnn_l-2-layers": SpaceGroup(
        "cnn_l flatten 2 layers",
        "flatten",
        "cnn_l_2_layers",
        2,
        0.1,
        net="cnn_l",
        alphas=(1.0, 0.1, 0.0),
    ),
    # darts (DP-FNAS, FedNAS): derived nets of random genotypes at the methods' defaults
    # (space.width 0.5: C = 4, 4 cells; GroupNorm and GAP, as the space builds them; the
    # methods' final-lr 0.05), and at lr 0.025 (the GroupNorm rows of norm-lr train better)
    "darts": SpaceGroup("darts derived", "gap", "darts", width=0.5, net="darts", norm="gn"),
    # the darts nets with a flatten classifier on the last cell's map (benchmark only:
    # ``_flatten_darts``; issue 40's cnn_s head finding, GroupNorm kept for DP-FNAS)
    "darts-flatten": SpaceGroup(
        "darts derived flatten", "flatten", "darts_flatten", width=0.5, net="darts", norm="gn"
    ),
    "darts-flatten-lr": SpaceGroup(
        "darts derived flatten lr 0.025",
        "flatten",
        "darts_flatten_lr",
        width=0.5,
        net="darts",
        norm="gn",
        lr=0.025,
    ),
    # the flatten darts nets at the methods' lr 0.05 with DARTS's gradient clipping (max
    # norm 5; FedML's FedNAS clips its derived net's training too): at 0.05 without it 9 of
    # 15 runs diverged
    "darts-flatten-clip": SpaceGroup(
        "darts derived flatten clip 5",
        "flatten",
        "darts_flatten_clip",
        width=0.5,
        net="darts",
        norm="gn",
        grad_clip=5.0,
        alphas=(0.1, 1.0, 0.0),
    ),
    # the clipped flatten rows with 2 cells at width 0.75 (C = 6) instead of 4 at 0.5: at
    # alpha 1.0 their median net was 2.5 pp below the ConvNet (goal: 2), and the shallower
    # mbconv and cnn_l spaces trained better (2 cells' derived nets of 100 draws: median
    # 0.42 MMACs, 22 within 10% of the target; 4 cells': 0.44, 18)
    "darts-2-cells-flatten-clip": SpaceGroup(
        "darts derived 2 cells flatten clip 5",
        "flatten",
        "darts_2_cells_flatten_clip",
        2,
        0.75,
        net="darts",
        norm="gn",
        grad_clip=5.0,
        alphas=(1.0,),
    ),
    # the 4-cell clipped flatten rows with DARTS's weight decay (3e-4): at alpha 1.0 their nets
    # end with training losses of 0.001-0.013 (the ConvNet's: 0.03) and test 2.5 pp below it
    # at the median, with 2 cells as with 4: do they fit the clients' data too closely?
    "darts-flatten-clip-wd": SpaceGroup(
        "darts derived flatten clip 5 wd 3e-4",
        "flatten",
        "darts_flatten_clip_wd",
        width=0.5,
        net="darts",
        norm="gn",
        grad_clip=5.0,
        alphas=(1.0,),
        weight_decay=3e-4,
    ),
    "darts-lr": SpaceGroup(
        "darts derived lr 0.025", "gap", "darts_lr", width=0.5, net="darts", norm="gn", lr=0.025
    ),
    # the flatten rows' classifier reads the last cell's 4 x 4 map: its input divided by 4
    # (``scale_flatten``: an SGD step then moves the logits as a GAP head's would, the
    # ConvNet's finding in ``scaled-head``), without the clip at alpha 1.0 (where the clipped
    # rows' median stayed 2.5 pp below the ConvNet), and with it at every setting
    "darts-flatten-scaled": SpaceGroup(
        "darts derived flatten-scaled",
        "flatten-scaled",
        "darts_flatten_scaled",
        width=0.5,
        net="darts",
        norm="gn",
        alphas=(1.0,),
    ),
    "darts-flatten-scaled-clip": SpaceGroup(
        "darts derived flatten-scaled clip 5",
        "flatten-scaled",
        "darts_flatten_scaled_clip",
        width=0.5,
        net="darts",
        norm="gn",
        grad_clip=5.0,
        alphas=(0.1, 1.0, 0.0),
    ),
    # DecNAS's nets: its built-in models (decnas.model) at space.width 0.25, pruned layer by
    # layer to the tier's MACs along seeded random NetAdapt trajectories (decnas_widths),
    # trained from scratch; each keeps its model's head (the ConvNet's flatten classifier,
    # MobileNetV1's GAP)
    "decnas-convnet": SpaceGroup(
        "decnas ConvNet pruned", "flatten", "decnas_convnet", width=0.25, net="decnas-convnet"
    ),
    "decnas-mobilenet": SpaceGroup(
        "decnas MobileNetV1 pruned", "gap", "decnas_mobilenet", width=0.25, net="decnas-mobilenet"
    ),
    # the same MobileNetV1 nets with a classifier on the last block's flattened map
    # (benchmark only: ``_flatten_mobilenet``): is it their GAP head, as for the spaces?
    "decnas-mobilenet-flatten": SpaceGroup(
        "decnas MobileNetV1 pruned flatten",
        "flatten",
        "decnas_mobilenet_flatten",
        width=0.25,
        net="decnas-mobilenet",
    ),
    # both heads with DARTS's gradient clipping (max norm 5, each local step): at alpha 1.0
    # the flatten rows' seed-0 nets end with training losses of 0.51-0.88 where the GAP
    # ones reach 0.23-0.32, as the unclipped flatten darts and mbconv nets did before the clip
    "decnas-mobilenet-clip": SpaceGroup(
        "decnas MobileNetV1 pruned clip 5",
        "gap",
        "decnas_mobilenet_clip",
        width=0.25,
        net="decnas-mobilenet",
        grad_clip=5.0,
    ),
    "decnas-mobilenet-flatten-clip": SpaceGroup(
        "decnas MobileNetV1 pruned flatten clip 5",
        "flatten",
        "decnas_mobilenet_flatten_clip",
        width=0.25,
        net="decnas-mobilenet",
        grad_clip=5.0,
    ),
    # what the four variants above share is an underfit net (training loss 0.34-0.50 after
    # 30 rounds at Dirichlet 0.1, the ConvNet's 0.06), which trains centrally: is it its 27
    # BatchNorms under label skew (each client normalises by its own classes' statistics:
    # Hsieh et al. 2020), or too small a step? The GAP nets with GroupNorm (2 groups, at
    # the rate GroupNorm trained best at in ``norm-lr``), and with BatchNorm at twice the rate
    "decnas-mobilenet-gn": SpaceGroup(
        "decnas MobileNetV1 pruned GroupNorm lr 0.025",
        "gap",
        "decnas_mobilenet_gn",
        width=0.25,
        net="decnas-mobilenet",
        norm="gn",
        lr=0.025,
        alphas=(0.1,),
    ),
    "decnas-mobilenet-lr": SpaceGroup(
        "decnas MobileNetV1 pruned lr 0.1",
        "gap",
        "decnas_mobilenet_lr",
        width=0.25,
        net="decnas-mobilenet",
        lr=0.1,
        alphas=(0.1,),
    ),
}


def setting_name(alpha: float) -> str:
    """A data setting as row labels name it: ``alpha 0.1``, ``alpha 1.0``; ``IID`` for 0."""
    return f"alpha {alpha}" if alpha else "IID"


def _central_rows(*groups: SpaceGroup) -> list[Row]:
    """The 5 paths of each group's rows (its net, head and width; the default depth) trained
    on the pooled data: the control for its federated rows."""
    return [
        Row(
            f"{group.label} path {k}, centralised",
            net=group.net,
            head=group.head,
            width=group.width,
            path=k,
            central=True,
        )
        for group in groups
        for k in range(5)
    ]


#: the table: each group of rows changes one factor from its group's first row
ROWS: dict[str, list[Row]] = {
    "head": [
        Row("cnn_s flatten, alpha 0.1"),
        Row("cnn_s GAP, alpha 0.1", head="gap"),
        Row("ConvNet flatten, alpha 0.1", net="convnet"),
        Row("ConvNet GAP, alpha 0.1", net="convnet", head="gap"),
    ],
    "skew": [
        Row("cnn_s flatten, IID", alpha=0.0),
        Row("cnn_s GAP, IID", head="gap", alpha=0.0),
        Row("ConvNet flatten, IID", net="convnet", alpha=0.0),
        Row("cnn_s flatten, alpha 1.0", alpha=1.0),
        Row("cnn_s GAP, alpha 1.0", head="gap", alpha=1.0),
        Row("ConvNet flatten, alpha 1.0", net="convnet", alpha=1.0),
    ],
    "central": [
        Row("cnn_s flatten, centralised", central=True),
        Row("cnn_s GAP, centralised", head="gap", central=True),
        Row("ConvNet flatten, centralised", net="convnet", central=True),
    ],
    "norm": [
        Row("cnn_s flatten, GroupNorm, alpha 0.1", norm="gn"),
        Row("cnn_s flatten, no norm, alpha 0.1", norm="none"),
    ],
    # GroupNorm's rate (issue 40 item 2: GroupNorm, needed for DP, must train well above
    # chance): the norm group's GroupNorm row at lower rates, the same recipe otherwise
    "norm-lr": [
        Row(f"cnn_s flatten, GroupNorm, lr {lr}, alpha 0.1", norm="gn", lr=lr)
        for lr in (0.025, 0.01)
    ],
    "width": [
        Row("cnn_s flatten, width 1.0, alpha 0.1", width=1.0),
        Row("cnn_s GAP, width 1.0, alpha 0.1", head="gap", width=1.0),
    ],
    "paths": [  # the best and median of 5 sampled nets of the tier's MACs (path 0: above)
        Row(f"cnn_s flatten path {k}, {setting_name(alpha)}", path=k, alpha=alpha)
        for alpha in (0.1, 1.0, 0.0)
        for k in range(1, 5)
    ],
    # the reduction (issue 40): the 5 paths of the tier's MACs centrally on the shapes
    # folder (10 epochs at 0.0125, the largest rate the ConvNet of this MACs trains at
    # there: lr_stability.py; pooled from an IID split), each with the paper's reduction and
    # with max pooling first (the same path, a quarter of the reductions' MACs)
    "reduction": [
        *(
            Row(
                f"cnn_s path {k}, {reduction}, shapes, centralised",
                **_CENTRAL_SHAPES,
                path=k,
                reduction=reduction,
            )
            for k in range(5)
            for reduction in REDUCTIONS
        ),
        Row("ConvNet flatten, shapes, centralised", net="convnet", **_CENTRAL_SHAPES),
    ],
    "reduction-federated": [  # path 0 by FedAvg: on shapes, then on MNIST-5k
        # alpha 1.0 only: at 0.1, 20 clients of the 1,800 images leave some client with
        # fewer than 3 (the partitioner refuses seed 1's draws)
        *(
            Row(f"cnn_s {r}, shapes, alpha 1.0", reduction=r, **_FEDERATED_SHAPES)
            for r in REDUCTIONS
        ),
        Row("ConvNet flatten, shapes, alpha 1.0", net="convnet", **_FEDERATED_SHAPES),
        Row("cnn_s maxpool-conv1x1, alpha 0.1", reduction="maxpool-conv1x1"),
        Row("cnn_s maxpool-conv1x1, alpha 1.0", reduction="maxpool-conv1x1", alpha=1.0),
    ],
    # the classifier's step (issue 40 item 4): the ConvNet's flatten head at the presets'
    # lr 0.05 collapses on shapes centrally, and its input divided by sqrt(H x W) trains
    # (lr_stability.py); the same by FedAvg, on shapes and on MNIST-5k
    "scaled-head": [
        *(
            Row(
                f"ConvNet {head}, shapes, alpha 1.0, lr {lr}",
                net="convnet",
                head=head,
                dataset="shapes",
                alpha=1.0,
                lr=lr,
            )
            for head in ("flatten", "flatten-scaled")
            for lr in (0.05, _SHAPES_LR)
            if (head, lr) != ("flatten", _SHAPES_LR)  # recorded: "ConvNet flatten, shapes, ..."
        ),
        Row("ConvNet flatten-scaled, alpha 0.1", net="convnet", head="flatten-scaled"),
        Row("ConvNet flatten-scaled, alpha 1.0", net="convnet", head="flatten-scaled", alpha=1.0),
    ],
    # the width baselines' full model (width 1), which collapsed centrally on shapes at 0.05;
    # on shapes at alpha 1.0 and on MNIST-5k at 0.1 (``--alphas`` picks one)
    "scaled-head-full": [
        *(
            Row(
                f"ConvNet width 1 {head}, shapes, alpha 1.0, lr 0.05",
                net="convnet-full",
                head=head,
                dataset="shapes",
                alpha=1.0,
                lr=0.05,
            )
            for head in ("flatten", "flatten-scaled")
        ),
        *(
            Row(f"ConvNet width 1 {head}, alpha 0.1", net="convnet-full", head=head)
            for head in ("flatten", "flatten-scaled")
        ),
    ],
    # the width baselines' budget (issue 40: FedorAS's fine-tuning plateaus within its 30
    # rounds, while baselines.py gives FjORD 122 rounds at alpha 0.1 and 151 at 1.0): does
    # the cnn_s net keep up with the ConvNet when both get 120 rounds?
    "rounds": [
        Row(f"{name} flatten, {setting_name(alpha)}, 120 rounds", net=net, alpha=alpha, rounds=120)
        for alpha in (0.1, 1.0)
        for net, name in (("cnn_s", "cnn_s"), ("convnet", "ConvNet"))
    ],
    # issue 40 item 2 for FDNAS / CFDNAS's space and cnn_l: 5 sampled nets of the tier's MACs
    # against the ConvNet rows of the same MACs and data, for each group of SPACE_GROUPS
    **{
        name: [
            Row(
                f"{group.label} path {k}, {setting_name(a)}",
                net=group.net,
                head=group.head,
                width=group.width,
                layers_per_stage=group.layers_per_stage,
                norm=group.norm,
                lr=group.lr,
                grad_clip=group.grad_clip,
                weight_decay=group.weight_decay,
                path=k,
                alpha=a,
            )
            for a in group.alphas
            for k in range(5)
        ]
        for name, group in SPACE_GROUPS.items()
    },
    # the control: the same 5 paths (default depth) with each head trained on the pooled data
    "mbconv-central": _central_rows(SPACE_GROUPS["mbconv-flatten"], SPACE_GROUPS["mbconv"]),
    # the control for DecNAS's MobileNetV1 nets, which stay far below the ConvNet of their
    # MACs under FedAvg at every skew, either head, clipped or not: the same 5 pruned nets
    # with each head trained on the pooled data (against "ConvNet flatten, centralised")
    "decnas-mobilenet-central": _central_rows(
        SPACE_GROUPS["decnas-mobilenet"], SPACE_GROUPS["decnas-mobilenet-flatten"]
    ),
    # DecNAS's MobileNetV1 nets train centrally but stay underfit under FedAvg with either
    # head or norm, clipped or at twice the rate: is it their depth (27 convolutions and
    # BatchNorms), or their pruning? MobileNetV1 whole at one narrow width, and 4 of its 13
    # separable blocks at a wider one, both of the tier's MACs, unpruned (GAP, BatchNorm)
    "decnas-mobilenet-depth": [
        Row(f"MobileNetV1 {name}, {setting_name(alpha)}", net=net, head="gap", alpha=alpha)
        for alpha in (0.1, 1.0)
        for net, name in (
            ("mobilenet-narrow", "13 blocks, narrow"),
            ("mobilenet-shallow", "4 blocks"),
        )
    ],
    # the 4 blocks with a classifier on their last map: what is left of the gap once the
    # depth is gone, is it the GAP head (the ConvNet lost 14.5 pp at alpha 0.1 with one)?
    "decnas-mobilenet-depth-flatten": [
        Row(
            f"MobileNetV1 4 blocks, flatten, {setting_name(alpha)}",
            net="mobilenet-shallow",
            head="flatten",
            alpha=alpha,
        )
        for alpha in (0.1, 1.0)
    ],
    "lr": [
        Row("cnn_s flatten, lr 0.01, alpha 0.1", lr=0.01),
        Row("cnn_s GAP, lr 0.1, alpha 0.1", head="gap", lr=0.1),
    ],
}

#: cnn_s (flatten) against the ConvNet at the same MACs, per data setting (the mbconv rows
#: of a setting too: ``mbconv-central``'s against the ConvNet trained centrally)
GAPS = {
    "alpha_0.1": ("cnn_s flatten, alpha 0.1", "ConvNet flatten, alpha 0.1"),
    "alpha_1.0": ("cnn_s flatten, alpha 1.0", "ConvNet flatten, alpha 1.0"),
    "iid": ("cnn_s flatten, IID", "ConvNet flatten, IID"),
    "central": ("cnn_s flatten, centralised", "ConvNet flatten, centralised"),
}


def _config(alpha: float, seed: int, dataset: str = "mnist5k") -> dict[str, Any]:
    """The app's run config with this row's data: MNIST-5k (or the shapes folder), IID
    (alpha 0) or Dirichlet."""
    from common import run_config
    from lr_stability import shapes_folder

    return run_config(
        {
            "data.dataset": shapes_folder() if dataset == "shapes" else dataset,
            "data.partitioner": "iid" if alpha == 0 else "dirichlet",
            "data.alpha": alpha or 1.0,
            "data.global-test": True,
            "seed": seed,
        }
    )


def _data(
    alpha: float, seed: int, dataset: str = "mnist5k"
) -> tuple[list[Any], Any, Any, dict[str, int]]:
    """Every client's training split, the server slice, the global test set, the image."""
    from fedorasflwr.config import parse_run_config
    from fedorasflwr.data import load_client_data, load_global_test, load_server_data
    from fedorasflwr.methods.widths.runner import image_spec

    settings = parse_run_config(_config(alpha, seed, dataset))
    spec = settings.data
    clients = [load_client_data(spec, i, NUM_CLIENTS).train for i in range(NUM_CLIENTS)]
    return clients, load_server_data(spec), load_global_test(spec), image_spec(settings)


def cnn_s_path(image: dict[str, int], width: float, k: int = 0) -> tuple[int, ...]:
    """A seeded path of ``cnn_s`` (GAP head: the paper's costs): ``k = 0`` the one nearest
    TARGET_MACS, ``k >= 1`` the k-th of the others within 10% of it, in sampling order
    (distinct architectures of one tier's MACs, as FedorAS's tier sampling draws them)."""
    from fedorasflwr.search_spaces import build_space

    # the paper's reduction and head: the paths (and MACs) recorded before either was a choice
    space = build_space("cnn_s", **image, width=width, head="gap", reduction=PAPER_REDUCTION)
    return space_path(space, k)


def space_path(space: Any, k: int = 0) -> tuple[int, ...]:
    """``cnn_s_path`` for any space: of 500 seeded paths, ``k = 0`` the one nearest
    TARGET_MACS, ``k >= 1`` the k-th of the others within 10% of it."""
    import numpy as np

    rng = np.random.default_rng(0)
    paths = [tuple(int(rng.integers(len(c.options))) for c in space.choices) for _ in range(500)]
    return _near_target(paths, lambda arch: space.cost(arch).flops / 2, k)


def _near_target(candidates: list[Any], macs: Callable[[Any], float], k: int) -> Any:
    """Of ``candidates`` (in draw order), ``k = 0`` the one whose ``macs`` are nearest
    TARGET_MACS, ``k >= 1`` the k-th of the other distinct ones within 10% of it."""
    nearest = min(candidates, key=lambda c: abs(macs(c) - TARGET_MACS))
    if k == 0:
        return nearest
    near = [c for c in dict.fromkeys(candidates) if abs(macs(c) / TARGET_MACS - 1) <= 0.1]
    others = [c for c in near if c != nearest]
    if k > len(others):
        raise ValueError(f"only {len(others)} other paths within 10% of {TARGET_MACS:g} MACs")
    return others[k - 1]


def darts_spec(image: dict[str, int], width: float, cells: int = 4) -> dict[str, Any]:
    """The ``darts`` space's spec as DP-FNAS and FedNAS build it from the run config at
    ``space.width = width``, ``space.layers-per-block = cells`` (4: the default depth) and
    DARTS's GAP head (``space.head = "gap"``, ``config.space_kwargs``): the rows' genotypes
    are drawn and matched to
    TARGET_MACS on it, and the flatten rows swap its classifier (``_flatten_darts``), as
    recorded before the space took the flatten head by default."""
    from fedorasflwr.config import SpaceSettings, space_kwargs
    from fedorasflwr.data.catalog import DatasetInfo
    from fedorasflwr.search_spaces import build_space

    shape = (image["in_channels"], image["input_height"], image["input_width"])
    info = DatasetInfo("image", "image", image["num_classes"], shape)
    settings = SpaceSettings(name="darts", width=width, head="gap", layers_per_block=cells)
    return dict(build_space(**space_kwargs(settings, info)).spec)


def darts_genotype(image: dict[str, int], width: float, k: int = 0, cells: int = 4) -> str:
    """A derived net of the ``darts`` space (``darts_spec``): the genotype (as text) of 100
    seeded random alphas, ``k = 0`` the one whose net's MACs are nearest TARGET_MACS,
    ``k >= 1`` the k-th of the others within 10% of it (what a search that has not moved
    its alphas yet would derive; DP-FNAS and FedNAS derive theirs from the searched ones)."""
    texts, macs = _darts_draws(tuple(sorted(image.items())), width, cells)
    return _near_target(list(texts), dict(macs).__getitem__, k)


@functools.cache
def _darts_draws(
    image: tuple[tuple[str, int], ...], width: float, cells: int = 4
) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """``darts_genotype``'s 100 drawn genotypes (texts, in draw order) and their nets' MACs."""
    import torch

    from fedorasflwr.search_spaces.base import _count_flops
    from fedorasflwr.search_spaces.darts import EDGES, PRIMITIVES, DartsSpace, derive_genotype

    spec = darts_spec(dict(image), width, cells)
    x = torch.zeros(1, spec["in_channels"], spec["input_height"], spec["input_width"])
    generator = torch.Generator().manual_seed(0)
    shape = (EDGES, len(PRIMITIVES))
    texts = tuple(
        derive_genotype(
            torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        ).to_text()
        for _ in range(100)
    )
    macs = {t: _count_flops(DartsSpace.derived_network(t, **spec), x) / 2 for t in set(texts)}
    return texts, tuple(sorted(macs.items()))


#: a NetAdapt step of decnas_widths: each cuts this share of the current net's MACs
DECNAS_STEP = 0.1


@functools.cache
def decnas_widths(model: str, image: tuple[tuple[str, int], ...], width: float, k: int) -> tuple:
    """The per-layer filters of a DecNAS net of the tier's MACs: ``model`` (``convnet`` or
    ``mobilenet``, DecNAS's built-ins) at ``width`` pruned as NetAdapt does, one layer a
    step, each step cutting DECNAS_STEP of the current MACs (the fewest filters that do)
    until the net is within TARGET_MACS; the layer of each step is drawn at random (seed
    ``k``) where NetAdapt takes the candidate that scores best, and no layer keeps fewer
    than a quarter of its filters (a candidate that thin loses its score and is not kept).
    Which filters go does not matter here: the rows train from scratch."""
    import random

    from fedorasflwr.search_spaces.prunable import build_prunable, resource

    base = build_prunable(model, **dict(image), width=width)
    spec, floor = base.spec, [max(1, w // 4) for w in base.widths]
    widths = list(base.widths)

    def macs(ws: list[int]) -> int:
        return resource({**spec, "widths": ws}, "macs")

    rng, current = random.Random(k), macs(widths)
    while current > TARGET_MACS:
        budget = max(TARGET_MACS, (1 - DECNAS_STEP) * current)
        for layer in rng.sample(range(len(widths)), len(widths)):
            keep = _most_filters(
                lambda w, i=layer, b=budget: macs(widths[:i] + [w] + widths[i + 1 :]) <= b,
                floor[layer],
                widths[layer] - 1,
            )
            if keep is not None:
                widths[layer] = keep
                break
        else:  # no single layer meets the step: take the largest cut one layer allows
            cuts = [
                (macs(widths[:i] + [floor[i]] + widths[i + 1 :]), i)
                for i in range(len(widths))
                if widths[i] > floor[i]
            ]
            if not cuts:
                raise ValueError(f"{model} at width {width}: cannot reach {TARGET_MACS:g} MACs")
            _, layer = min(cuts)
            widths[layer] = floor[layer]
        current = macs(widths)
    return tuple(widths)


def _most_filters(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest ``w`` in ``[low, high]`` with ``fits(w)`` (true for every smaller one:
    MACs grow with a layer's filters), by bisection; None if not even ``low`` fits."""
    if high < low or not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def _swap_norm(net: Any, norm: str) -> None:
    """Replace every BatchNorm2d of ``net`` by GroupNorm (2 groups, affine) or Identity."""
    from torch import nn

    for module in list(net.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                channels = child.num_features
                groups = 2 if channels % 2 == 0 else 1
                new = nn.GroupNorm(groups, channels) if norm == "gn" else nn.Identity()
                setattr(module, child_name, new)


def build_net(row: Row, image: dict[str, int]) -> tuple[Any, int]:
    """``row``'s network, seeded by the caller, and its MACs (one sample)."""
    import torch

    from fedorasflwr.search_spaces import build_space
    from fedorasflwr.search_spaces.base import _count_flops
    from fedorasflwr.search_spaces.widths import width_net

    x = torch.zeros(1, image["in_channels"], image["input_height"], image["input_width"])
    if row.net == "cnn_s":
        arch = cnn_s_path(image, row.width, row.path)
        space = build_space(
            "cnn_s", **image, width=row.width, head=row.head, reduction=row.reduction
        )
        net = space.subnet(arch)
        if row.norm != "bn":
            _swap_norm(net, row.norm)
        return net, _count_flops(net, x) // 2
    if row.net == "mbconv":  # a head, the space's BatchNorm: a row says nothing else
        if row.norm != "bn" or row.reduction != PAPER_REDUCTION:
            raise ValueError(f"mbconv rows: norm 'bn', no reduction; got {row}")
        kwargs = {"width": row.width, "layers_per_stage": row.layers_per_stage}
        # the paths are drawn by the paper's (GAP) costs, so every head trains the same paths
        paths = build_space("mbconv", **image, **kwargs, head="gap")
        head = "flatten" if row.head == "flatten-scaled" else row.head
        net = build_space("mbconv", **image, **kwargs, head=head).subnet(
            space_path(paths, row.path)
        )
        if row.head == "flatten-scaled":
            scale_flatten(net.net, net.net.head[0].out_channels)
        return net, _count_flops(net, x) // 2
    if row.net == "cnn_l":  # BatchNorm, a head, a depth (layers a block: the default's 4)
        if row.norm != "bn" or row.reduction != PAPER_REDUCTION or row.head not in HEADS:
            raise ValueError(f"cnn_l rows: norm 'bn', no reduction, head of {HEADS}; got {row}")
        kwargs = {"width": row.width, "layers_per_block": row.layers_per_stage}
        paths = build_space("cnn_l", **image, **kwargs, head="gap")  # the paper's costs
        net = build_space("cnn_l", **image, **kwargs, head=row.head).subnet(
            space_path(paths, row.path)
        )
        return net, _count_flops(net, x) // 2
    if row.net == "darts":  # a derived net (GroupNorm, as the space builds it), GAP or flatten
        heads = (*HEADS, "flatten-scaled")
        if row.norm != "gn" or row.head not in heads or row.reduction != PAPER_REDUCTION:
            raise ValueError(f"darts rows: norm 'gn', head of {heads}, no reduction; got {row}")
        from fedorasflwr.search_spaces.darts import DartsSpace

        cells = row.layers_per_stage  # the default's 4 cells unless a group says
        genotype = darts_genotype(image, row.width, row.path, cells)
        net = DartsSpace.derived_network(genotype, **darts_spec(image, row.width, cells))
        if row.head in ("flatten", "flatten-scaled"):
            net = _flatten_darts(net, x)
        if row.head == "flatten-scaled":
            import torch

            with torch.no_grad():
                scale_flatten(net, _darts_body(net, x).shape[1])
        return net, _count_flops(net, x) // 2
    if row.net.startswith("decnas-"):  # a pruned net of DecNAS's model, its own head
        from fedorasflwr.search_spaces.prunable import build_prunable

        model = row.net.removeprefix("decnas-")
        heads = {"convnet": ("flatten",), "mobilenet": ("gap", "flatten")}
        norms = {"convnet": ("bn",), "mobilenet": ("bn", "gn")}
        if model not in heads or row.head not in heads[model] or row.norm not in norms[model]:
            raise ValueError(
                "decnas rows: convnet (flatten, BN) or mobilenet (gap or flatten, BN or GN); "
                f"got {row}"
            )
        widths = decnas_widths(model, tuple(sorted(image.items())), row.width, row.path)
        net = build_prunable(model, **image, width=row.width, widths=widths)
        if model == "mobilenet" and row.head == "flatten":
            net = _flatten_mobilenet(net.model, x)
        if row.norm != "bn":  # the pruned net's widths, then its norms swapped
            _swap_norm(net, row.norm)
        return net, _count_flops(net, x) // 2
    if row.net in MOBILENET_DEPTHS:  # MobileNetV1's blocks at one width, unpruned
        if row.head not in HEADS or row.norm != "bn" or row.reduction != PAPER_REDUCTION:
            raise ValueError(f"{row.net} rows: head of {HEADS}, norm 'bn', no reduction; got {row}")
        net = _mobilenet_of_target_macs(MOBILENET_DEPTHS[row.net], image, x)
        if row.head == "flatten":  # the GAP net's width, its classifier on the last map
            net = _flatten_mobilenet(net, x)
        return net, _count_flops(net, x) // 2
    if row.net not in ("convnet", "convnet-full"):
        raise ValueError(
            f"Row.net {row.net!r}: cnn_s, cnn_l, mbconv, darts, decnas-convnet, "
            f"decnas-mobilenet, {', '.join(MOBILENET_DEPTHS)}, convnet or convnet-full"
        )
    if row.head not in ("flatten", "gap", "flatten-scaled"):
        raise ValueError(f"ConvNet rows: head 'flatten', 'gap' or 'flatten-scaled'; got {row}")
    if row.net == "convnet-full":  # the width baselines' full model (width 1)
        width = 1.0
    else:  # the ConvNet width whose MACs are nearest the cnn_s path's (default width)
        paper = build_space("cnn_s", **image, width=0.5, reduction=PAPER_REDUCTION)
        target = _count_flops(paper.subnet(cnn_s_path(image, 0.5)), x) // 2
        widths = [w / 100 for w in range(5, 101)]
        width = min(widths, key=lambda w: abs(_count_flops(width_net(image, w), x) // 2 - target))
    # "flatten-scaled": the package's ConvNet head (prunable_nets.ConvNet, issue 40)
    net = width_net(image, width, "flatten-scaled" if row.head == "flatten-scaled" else "flatten")
    if row.head == "gap":
        net = _gap_convnet(net, image["num_classes"])
    return net, _count_flops(net, x) // 2


def scale_flatten(net: Any, channels: int) -> None:
    """Divide the input of ``net``'s flatten classifier (``net.classifier``, reading a map of
    ``channels`` channels) by sqrt(H x W) of that map: its squared norm is then about the
    positions' mean, as GAP's input's, so an SGD step moves the logits about as far. (An
    ``MBConvSupernet`` built with ``head="flatten"``, a darts net of ``_flatten_darts``; the
    ConvNet has it built in since 2026-12-07: ``head="flatten-scaled"``, the same ops.)"""
    import math

    from torch import nn

    linear = net.classifier
    positions = linear.in_features // channels

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = 1 / math.sqrt(positions)
            self.linear = linear

        def forward(self, x: Any) -> Any:
            return self.linear(x * self.scale)

    net.classifier = Scaled()


def _flattened(parts: dict[str, Any], body: Any, classes: int, x: Any) -> Any:
    """A net of ``parts`` (modules, kept under their names) whose classifier reads the map
    ``body(net, x)`` returns flattened (C x H x W): a fresh ``nn.Linear`` sized by one pass of
    ``x`` (an input of the task's shape), drawn after the parts as before."""
    import torch
    from torch import nn

    class Flattened(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, module in parts.items():
                self.add_module(name, module)
            with torch.no_grad():
                features = self.features(x).shape[1]
            self.classifier = nn.Linear(features, classes)

        def features(self, x: Any) -> Any:
            return body(self, x).flatten(1)

        def forward(self, x: Any) -> Any:
            return self.classifier(self.features(x))

    return Flattened()


def _darts_body(net: Any, x: Any) -> Any:
    s0 = s1 = net.stem(x)
    for cell in net.cells:
        s0, s1 = s1, cell(s0, s1)
    return s1


def _mobilenet_body(net: Any, x: Any) -> Any:
    x = net.stem(x)
    for block in net.blocks:
        x = block(x)
    return x


def _flatten_darts(net: Any, x: Any) -> Any:
    """A darts derived net (``DerivedNetwork``) whose classifier reads the last cell's map
    flattened (C x H x W) instead of its global average: the space's cells and stem kept, a
    fresh classifier (``x``: an input of the task's shape). The layout the space's
    ``head = "flatten"`` builds (its default since issue 40); kept so the recorded rows
    reproduce: there the classifier is drawn without a GAP one before it."""
    parts = {"stem": net.stem, "cells": net.cells}
    return _flattened(parts, _darts_body, net.classifier.out_features, x)


def _flatten_mobilenet(net: Any, x: Any) -> Any:
    """A ``MobileNetV1`` (DecNAS's built-in) whose classifier reads the last block's map
    flattened (C x H x W) instead of its global average: the stem and blocks kept, a fresh
    classifier (``x``: an input of the task's shape). Benchmark only."""
    parts = {"stem": net.stem, "blocks": net.blocks}
    return _flattened(parts, _mobilenet_body, net.classifier.out_features, x)


class ShallowMobileNet(MobileNetV1):
    """MobileNetV1 with 4 of its 13 depthwise-separable blocks: the stem, then blocks of
    2x, 4x, 8x, 8x its filters at strides 2, 2, 2, 1 (28 px: 14, 7, 4, 4), GAP, one FC
    layer: 9 convolutions and BatchNorms where MobileNetV1 has 27 (benchmark only)."""

    base_widths = (32, 64, 128, 256, 256)
    strides = (2, 2, 2, 1)


#: ``Row.net`` of the depth rows: MobileNetV1 whole, or 4 of its blocks, each at the one
#: width multiplier whose MACs are nearest TARGET_MACS (no pruning)
MOBILENET_DEPTHS = {"mobilenet-narrow": MobileNetV1, "mobilenet-shallow": ShallowMobileNet}


def _mobilenet_of_target_macs(cls: type, image: dict[str, int], x: Any) -> Any:
    """``cls`` at the width (0.01 steps) whose MACs are nearest TARGET_MACS; the search
    draws on a forked RNG, so the caller's seed initialises the net."""
    import torch

    from fedorasflwr.search_spaces.base import _count_flops

    def macs(hundredths: int) -> int:
        return _count_flops(cls(**image, width=hundredths / 100), x) // 2

    with torch.random.fork_rng():
        # the most hundredths within the target (MACs grow with the width), or one more,
        # whichever is nearer
        within = _most_filters(lambda w: macs(w) <= TARGET_MACS, 1, 100)
        if within is None:
            raise ValueError(f"{cls.__name__} at width 0.01 is above {TARGET_MACS:g} MACs")
        width = min((within, min(within + 1, 100)), key=lambda w: abs(macs(w) - TARGET_MACS))
    return cls(**image, width=width / 100)


def _gap_convnet(convnet: Any, num_classes: int) -> Any:
    """The ConvNet's convolutional blocks, then GAP and a linear classifier."""
    from torch import nn

    class GapConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = convnet.blocks
            channels = [m for m in self.blocks.modules() if isinstance(m, nn.Conv2d)][-1]
            self.classifier = nn.Linear(channels.out_channels, num_classes)

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.classifier(x.mean((2, 3)))

    return GapConvNet()


def train_row(row: Row, seed: int) -> dict[str, Any]:
    """FedAvg (or pooled SGD) of ``row``'s net; its global-test accuracy after BN refresh."""
    import numpy as np
    import torch
    from torch.utils.data import ConcatDataset

    from fedorasflwr.seeding import numpy_stream, seed_torch, stream_words
    from fedorasflwr.training import (
        evaluate,
        has_batchnorm,
        local_sgd,
        ordered_loader,
        refresh_batchnorm,
    )

    torch.set_num_threads(1)
    started = time.monotonic()
    clients, server, test, image = _data(row.alpha, seed, row.dataset)
    seed_torch(seed, "space-ablation-init")
    net, macs = build_net(row, image)
    config = {
        "lr": row.lr,
        "momentum": 0.9,
        "batch-size": 32,
        "local-epochs": row.local_epochs,
        "grad-clip": row.grad_clip,
        "weight-decay": row.weight_decay,
    }
    losses = []
    if row.central:  # the same number of epochs over the pooled data as one client sees
        pooled = ConcatDataset(clients)
        for epoch in range(row.rounds):
            done = local_sgd(
                net,
                pooled,
                {**config, "local-epochs": 1},
                stream_words(seed, "space-ablation-central", epoch),
            )
            losses.append(done.loss)
    else:
        rng = numpy_stream(seed, "space-ablation-sampling")
        for round_ in range(row.rounds):
            chosen = sorted(rng.choice(NUM_CLIENTS, row.clients_per_round, replace=False))
            start = {k: v.clone() for k, v in net.state_dict().items()}
            total, weighted, loss = 0, None, 0.0
            for client in chosen:  # a fixed order: same seed, same sum
                net.load_state_dict(start)
                done = local_sgd(
                    net,
                    clients[client],
                    config,
                    stream_words(seed, "space-ablation", round_, int(client)),
                )
                n = len(clients[client])
                state = net.state_dict()
                if weighted is None:
                    weighted = {k: v.double() * n for k, v in state.items()}
                else:
                    for k, v in state.items():
                        weighted[k] += v.double() * n
                total += n
                loss += done.loss * n
            net.load_state_dict({k: (v / total).to(start[k].dtype) for k, v in weighted.items()})
            losses.append(loss / total)
    if has_batchnorm(net):
        refresh_batchnorm(net, server)
    net.eval()
    with torch.no_grad():
        result = evaluate(net, ordered_loader(test), torch.device("cpu"))
    return {
        "row": row.label,
        "seed": seed,
        "settings": asdict(row),
        "macs": int(macs),
        "accuracy": result.correct / result.count,
        "final_train_loss": losses[-1],
        "finite": bool(np.isfinite(losses).all()),
        "seconds": round(time.monotonic() - started, 1),
    }


def _recorded_runs() -> list[dict[str, Any]]:
    """The runs in ``results/space_ablation.json``; none when it is missing (an unreadable
    file stops the run before it would be overwritten with only the new rows)."""
    import json

    from common import RESULTS

    path = RESULTS / "space_ablation.json"
    if not path.exists():
        return []
    return list(json.loads(path.read_text())["runs"])


def merge_runs(recorded: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``recorded`` runs whose (row, seed) ``new`` does not rerun, then ``new``."""
    rerun = {(run["row"], run["seed"]) for run in new}
    return [run for run in recorded if (run["row"], run["seed"]) not in rerun] + list(new)


def gaps_pp(table: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``gap_pp_<setting>``: the ``cnn_s`` flatten path's mean accuracy minus the ConvNet's
    at the same MACs, in percentage points, for each setting of :data:`GAPS` both ran;
    ``paths_<setting>_best_pp`` / ``_median_pp``: the same for the best and median of the
    5 sampled paths (path 0 and the ``paths`` rows) where all 5 ran, each mean (the
    ConvNet's too) over the seeds all six rows ran where the entries say which
    (``by_seed``), ``paths_<setting>_seeds`` how many: a path run at one seed is not set
    against another seed's ConvNet. ``mbconv_<setting>_best_pp`` / ``_median_pp`` /
    ``_seeds``: the same for the 5 ``mbconv`` rows (GAP head), ``mbconv_flatten_...`` for
    the 5 ``mbconv-flatten`` rows, ``mbconv_scaled_...`` for the 5 ``mbconv-scaled`` rows."""
    out: dict[str, float] = {}
    for setting, (ours, hand_made) in GAPS.items():
        if hand_made not in table:
            continue
        if ours in table:
            gap = table[ours]["mean"] - table[hand_made]["mean"]
            out[f"gap_pp_{setting}"] = round(100 * gap, 1)
        suffix = ours.split(", ", 1)[1]
        sampled = [ours] + [f"cnn_s flatten path {k}, {suffix}" for k in range(1, 5)]
        out.update(_best_and_median(table, sampled, hand_made, f"paths_{setting}"))
        for group in SPACE_GROUPS.values():
            rows = [f"{group.label} path {k}, {suffix}" for k in range(5)]
            out.update(_best_and_median(table, rows, hand_made, f"{group.prefix}_{setting}"))
    return out


def _best_and_median(
    table: dict[str, dict[str, Any]], sampled: list[str], hand_made: str, prefix: str
) -> dict[str, float]:
    """The best and the median of the ``sampled`` rows minus the ``hand_made`` row, in pp,
    each a mean over the seeds all of them ran (where the entries say, ``by_seed``)."""
    if not all(label in table for label in (*sampled, hand_made)):
        return {}
    rows = [table[label] for label in (*sampled, hand_made)]
    out: dict[str, float] = {}
    if all("by_seed" in row for row in rows):
        seeds = set.intersection(*(set(row["by_seed"]) for row in rows))
        if not seeds:
            return {}

        def mean(row: dict[str, Any], seeds: set = seeds) -> float:
            return statistics.fmean(row["by_seed"][seed] for seed in seeds)

        out[f"{prefix}_seeds"] = len(seeds)
    else:

        def mean(row: dict[str, Any]) -> float:
            return row["mean"]

    reference = mean(table[hand_made])
    means = sorted(mean(table[label]) for label in sampled)
    out[f"{prefix}_best_pp"] = round(100 * (means[-1] - reference), 1)
    out[f"{prefix}_median_pp"] = round(100 * (means[len(means) // 2] - reference), 1)
    return out


def reduction_gaps_pp(table: dict[str, dict[str, Any]]) -> dict[str, float]:
    """For each ``cnn_s`` reduction, on the shapes folder: the best and the median of its 5
    paths trained centrally minus the ConvNet trained so (``shapes_central_<reduction>_best_pp``
    / ``_median_pp``), where all ran; and path 0 by FedAvg at alpha 1.0 minus the ConvNet
    (``shapes_alpha_1.0_<reduction>_pp``); in percentage points."""
    out: dict[str, float] = {}
    central = table.get("ConvNet flatten, shapes, centralised")
    federated = table.get("ConvNet flatten, shapes, alpha 1.0")
    for reduction in REDUCTIONS:
        labels = [f"cnn_s path {k}, {reduction}, shapes, centralised" for k in range(5)]
        if central is not None and all(label in table for label in labels):
            means = sorted(table[label]["mean"] for label in labels)
            out[f"shapes_central_{reduction}_best_pp"] = round(
                100 * (means[-1] - central["mean"]), 1
            )
            out[f"shapes_central_{reduction}_median_pp"] = round(
                100 * (means[2] - central["mean"]), 1
            )
        label = f"cnn_s {reduction}, shapes, alpha 1.0"
        if federated is not None and label in table:
            gap = table[label]["mean"] - federated["mean"]
            out[f"shapes_alpha_1.0_{reduction}_pp"] = round(100 * gap, 1)
    return out


def _job(args: tuple[Row, int]) -> dict[str, Any]:
    return train_row(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=sorted(ROWS))
    parser.add_argument(
        "--alphas", type=float, nargs="+", help="only the rows of these settings (0: IID)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rows = [row for group in args.rows for row in ROWS[group]]
    if args.alphas is not None:
        rows = [row for row in rows if row.alpha in args.alphas]
        if not rows:
            parser.error(f"--alphas {args.alphas}: none of the rows of {args.rows} has them")
    if args.quick:
        rows = [replace(r, rounds=2, clients_per_round=4) for r in ROWS["head"][:2]]
        args.seeds = [0]
    jobs = [(row, seed) for row in rows for seed in args.seeds]
    data = sorted({(row.alpha, row.dataset) for row in rows})
    warm_data_cache([_config(a, s, d) for a, d in data for s in args.seeds], NUM_CLIENTS)
    recorded = [] if args.quick else _recorded_runs()  # read before hours of training
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = list(pool.map(_job, jobs))
    results = merge_runs(recorded, results)  # the rows and seeds not rerun now are kept
    table: dict[str, dict[str, Any]] = {}
    for result in results:
        entry = table.setdefault(
            result["row"], {"macs": result["macs"], "accuracy": [], "by_seed": {}}
        )
        entry["accuracy"].append(result["accuracy"])
        entry["by_seed"][result["seed"]] = result["accuracy"]
    print(f"{'row':<44} {'MACs':>9} {'accuracy (mean, per seed)':>30}")
    for label, entry in table.items():
        accs = entry["accuracy"]
        entry["mean"] = statistics.fmean(accs)
        print(
            f"{label:<44} {entry['macs'] / 1e6:>8.3f}M {entry['mean']:>8.3f}  "
            + " ".join(f"{a:.3f}" for a in accs)
        )
    # the most seeds any row has (a partial rerun keeps the other rows' recorded seeds)
    seeds = max(len(entry["accuracy"]) for entry in table.values())
    summary: dict[str, Any] = {"rows": len(table), "seeds": seeds}
    for key, label in (("flatten", ROWS["head"][0].label), ("gap", ROWS["head"][1].label)):
        if label in table:
            summary[f"cnn_s_{key}"] = round(table[label]["mean"], 3)
    summary.update(gaps_pp(table))
    summary.update(reduction_gaps_pp(table))
    report("space_ablation", args.quick, summary, {"rows": table, "runs": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
