"""HeteroFL and FjORD: settings, tiers, slice-wise aggregation of real replies, the
ordered-dropout loop, and a tiny run of each on the in-process grid."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedorasflwr.client_app import app as client_app
from fedorasflwr.config import bound_settings, parse_run_config
from fedorasflwr.federation.aggregation import Aggregation
from fedorasflwr.federation.base import NodeProfile
from fedorasflwr.inprocess import InProcessGrid
from fedorasflwr.methods.widths.client import ordered_dropout_sgd
from fedorasflwr.methods.widths.strategy import TRAIN, to_numpy, to_record
from fedorasflwr.nonce import echo
from fedorasflwr.protocol import ARRAYS, METRICS
from fedorasflwr.search_spaces.widths import sub_arrays, width_net, width_shapes
from fedorasflwr.strategies import FjORD, FjORDSettings, HeteroFL, HeteroFLSettings
from tests.runconfig import FEW_ROWS, pyproject_run_config

MNIST = {"num_classes": 10, "in_channels": 1, "input_height": 28, "input_width": 28}


def tiny(cache, method: str, **overrides):
    config = pyproject_run_config()
    config.update(
        {
            "method": method,
            "data.cache-dir": str(cache),
            "onnx": False,
            f"{method}.rounds": 1,
            f"{method}.batch-size": 64,
            # the server's lr probe (48 steps per rate on the full-width net, before round 1:
            # a third of a tiny run) has its own tests here, the resume's among them
            f"{method}.lr-probe": False,
            **overrides,
        }
    )
    return config


def profile(node_id: int, partition_id: int, tier: int = -1) -> NodeProfile:
    return NodeProfile(node_id, partition_id, 4, 100, 10, 10, (10,) * 10, tier=tier)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("heterofl.widths", "0.5,0.25", "heterofl.widths"),
        ("heterofl.widths", "0,1", "heterofl.widths"),
        ("fjord.tier-widths", "0.3,1.0", "fjord.tier-widths"),
        ("fjord.widths", "1.0,2.0", "fjord.widths"),
    ],
)
def test_bad_widths_name_the_key(key, value, words) -> None:
    method = "heterofl" if "." not in key else key.split(".")[0]
    config = pyproject_run_config() | {"method": method, key: value}
    with pytest.raises(ValueError, match=words):
        parse_run_config(config)


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_the_settings_and_the_strategy_agree_on_the_aggregation(method) -> None:
    """Issue 43: what ``from_config`` accepts the strategy honours, and a rule refused by
    hand is refused from the run config, each naming the key, the value and the allowed."""
    cls, strategy_class = {
        "heterofl": (HeteroFLSettings, HeteroFL),
        "fjord": (FjORDSettings, FjORD),
    }[method]
    run_config = pyproject_run_config() | {"method": method, "aggregation": "median"}
    paths = {
        "parse_run_config": parse_run_config(run_config).method_settings,
        "from_config": cls.from_config({"aggregation": "median"}),
        "by hand": cls(aggregation_rule="median"),
    }
    for path, settings in paths.items():
        strategy = strategy_class(image=MNIST, settings=settings, seed=0)
        assert strategy.aggregation == Aggregation("median"), path
    trimmed = cls.from_config({"aggregation": "trimmed-mean", "aggregation-trim": 0.25})
    assert strategy_class(image=MNIST, settings=trimmed, seed=0).aggregation == Aggregation(
        "trimmed-mean", 0.25
    )
    allowed = "allowed: one of mean, median, trimmed-mean"
    with pytest.raises(ValueError, match=f"{cls.__name__}.aggregation_rule = 'krum'.*{allowed}"):
        cls(aggregation_rule="krum")
    with pytest.raises(ValueError, match=f"run config 'aggregation' = 'krum'.*{allowed[9:]}"):
        cls.from_config({"aggregation": "krum"})
    parse_run_config(run_config | {"method": "fedoras"})  # another method's run: no error


def test_a_median_round_takes_each_entrys_median_over_its_holders(task) -> None:
    settings = HeteroFLSettings(aggregation_rule="median")
    strategy = HeteroFL(image=MNIST, settings=settings, seed=0)
    strategy.profiles = {7: profile(7, 1), 8: profile(8, 3), 9: profile(9, 2)}
    strategy.tiers = {7: 1, 8: 3, 9: 3}  # widths 0.5, 1.0, 1.0
    strategy.use_model(ArrayRecord())
    messages = strategy._messages(strategy._global, strategy.profiles.values(), 1, TRAIN)
    sent = strategy.instruct("train", "train", 1, messages)
    values = ((1.0, 1), (5.0, 3), (6.0, 1))
    fused, metrics = strategy.aggregate_train(1, _replies(strategy, sent, values))
    weight = fused["blocks.1.conv.weight"].numpy()  # node 7 holds [:16, :16]
    np.testing.assert_allclose(weight[:16, :16], 5.0)  # median(1, 5, 6); the mean: 4.4
    np.testing.assert_allclose(weight[16:], 5.5)  # median(5, 6), the counts ignored
    assert metrics["clients"] == 3


def test_tiers_come_from_the_node_config_else_partition_ranges() -> None:
    settings = parse_run_config(pyproject_run_config() | {"method": "heterofl"}).method_settings
    strategy = HeteroFL(image=MNIST, settings=settings, seed=0)
    assert [strategy.tier_of(profile(1, p)) for p in range(4)] == [0, 1, 2, 3]
    assert strategy.tier_of(profile(1, 0, tier=4)) == 3  # declared 1-based, as for FedorAS
    assert strategy.tier_of(profile(1, 3, tier=1)) == 0
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"tier {bad}: allowed 1..4"):
            strategy.tier_of(profile(1, 0, tier=bad))


@pytest.fixture
def task(data_cache) -> None:
    InProcessGrid(client_app, tiny(data_cache, "heterofl"), 1)  # sets the task identity


def _replies(strategy, sent, values):
    replies = []
    for message, (value, count) in zip(sent, values, strict=True):
        shapes = width_shapes(MNIST, strategy.width_of(message.metadata.dst_node_id))
        arrays = {k: np.full(s, value, dtype=np.float32) for k, s in shapes.items()}
        arrays = {k: v.astype(np.int64) if "num_batches" in k else v for k, v in arrays.items()}
        content = RecordDict(
            {ARRAYS: to_record(arrays), METRICS: MetricRecord({"num-examples": count})}
        )
        replies.append(echo(message, Message(content, reply_to=message)))
    return replies


def test_each_entry_is_averaged_over_the_replies_that_hold_it(task) -> None:
    settings = parse_run_config(pyproject_run_config() | {"method": "heterofl"}).method_settings
    strategy = HeteroFL(image=MNIST, settings=settings, seed=0)
    strategy.profiles = {7: profile(7, 1), 8: profile(8, 3)}  # tiers 1 (0.5) and 3 (1.0)
    strategy.tiers = {7: 1, 8: 3}
    strategy.use_model(ArrayRecord())
    messages = strategy._messages(strategy._global, strategy.profiles.values(), 1, TRAIN)
    sent = strategy.instruct("train", "train", 1, messages)  # what aggregate_train screens by
    fused, metrics = strategy.aggregate_train(1, _replies(strategy, sent, ((1.0, 1), (5.0, 3))))
    weight = fused["blocks.1.conv.weight"].numpy()  # (32, 32, 3, 3), node 7 holds [:16, :16]
    np.testing.assert_allclose(weight[:16, :16], 4.0)  # (1 x 1 + 5 x 3) / 4
    np.testing.assert_allclose(weight[16:], 5.0)
    np.testing.assert_allclose(weight[:16, 16:], 5.0)
    assert metrics["num-examples"] == 4 and metrics["clients"] == 2


def test_a_reply_of_another_width_is_dropped(task, caplog) -> None:
    settings = parse_run_config(pyproject_run_config() | {"method": "heterofl"}).method_settings
    strategy = HeteroFL(image=MNIST, settings=settings, seed=0)
    strategy.profiles = {7: profile(7, 1), 8: profile(8, 3)}
    strategy.tiers = {7: 1, 8: 3}
    strategy.use_model(ArrayRecord())
    messages = strategy._messages(strategy._global, strategy.profiles.values(), 1, TRAIN)
    sent = strategy.instruct("train", "train", 1, messages)  # what aggregate_train screens by
    strategy.tiers = {7: 3, 8: 3}  # node 7's reply now has the wrong (half) shapes
    fused, metrics = strategy.aggregate_train(1, _replies(strategy, sent[1:], ((5.0, 3),)))
    assert metrics["clients"] == 1
    strategy.tiers = {7: 1, 8: 3}
    bad = _replies(strategy, sent[:1], ((1.0, 1),))
    strategy.tiers = {7: 3, 8: 3}
    assert strategy.aggregate_train(1, bad) == (None, None)
    assert "dropped reply of node 7" in caplog.text


def test_ordered_dropout_trains_only_the_sampled_slice(data_cache) -> None:
    from fedorasflwr.data import load_client_data

    settings = parse_run_config(pyproject_run_config() | {"data.cache-dir": str(data_cache)})
    data = load_client_data(settings.data, 0, 20)
    torch.manual_seed(0)
    net = width_net(MNIST, 0.5)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    config = ConfigRecord(
        {
            "width": 0.5,
            "widths": [0.25, 1.0],  # up to p_max 0.5: only 0.25 is ever sampled
            "width-macs": [1, 4],
            "local-epochs": 1,
            "batch-size": 32,
            "lr": 0.1,
            "momentum": 0.0,
        }
    )
    rng = np.random.default_rng(0)  # the width is fixed whatever it draws
    loss, seen, flops = ordered_dropout_sgd(
        net, partial(width_net, MNIST), data.train, config, (0, 1), rng
    )
    after = net.state_dict()
    inner = width_shapes(MNIST, 0.25)["blocks.1.conv.weight"]
    w0, w1 = before["blocks.1.conv.weight"], after["blocks.1.conv.weight"].cpu()
    assert not torch.equal(w0[: inner[0], : inner[1]], w1[: inner[0], : inner[1]])
    assert torch.equal(w0[inner[0] :], w1[inner[0] :])  # outside the 0.25 slice: untouched
    assert seen == len(data.train) and flops > 0 and np.isfinite(loss)


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_a_tiny_run_serves_every_tier(method, data_cache) -> None:
    config = tiny(data_cache, method)
    settings = parse_run_config(config)
    strategy = (HeteroFL if method == "heterofl" else FjORD)(
        image=MNIST, settings=settings.method_settings, seed=settings.seed
    )
    result = strategy.start(InProcessGrid(client_app, config, 4), ArrayRecord(), num_rounds=1)
    assert [t.width for t in result.tiers] == [0.25, 0.5, 0.75, 1.0]
    assert [t.partitions for t in result.tiers] == [[0], [1], [2], [3]]
    assert all(t.test_count > 0 and t.test_accuracy is not None for t in result.tiers)
    assert result.ledger["train"]["totals"]["replies"] == 4
    assert result.ledger["train"]["totals"]["train_flops"] > 0  # what the clients reported
    small = to_numpy(strategy.tier_arrays(0))
    full = to_numpy(result.arrays)
    for name, value in sub_arrays(full, width_shapes(MNIST, 0.25)).items():
        np.testing.assert_array_equal(small[name], value)


@pytest.mark.parametrize("head", ["flatten", "flatten-scaled"])
def test_a_tier_model_file_loads_back_as_the_same_net(tmp_path, head) -> None:
    from fedorasflwr.data import load_server_data
    from fedorasflwr.methods.widths.runner import save_tier
    from fedorasflwr.model_files import load_model
    from fedorasflwr.runs import RunFiles
    from fedorasflwr.training import refresh_batchnorm

    config = {"method": "heterofl", "onnx": False, "data.cache-dir": str(tmp_path / "cache")}
    settings = parse_run_config(pyproject_run_config() | config)
    torch.manual_seed(0)
    full = to_numpy(ArrayRecord(width_net(MNIST, 1.0).state_dict()))
    arrays = to_record(sub_arrays(full, width_shapes(MNIST, 0.5)))
    run = RunFiles(tmp_path, settings, {"name": "widths-convnet", **MNIST, "head": head}, None)
    save_tier(run, MNIST, 1, 0.5, arrays, head)
    assert run.document()["files"] == ["tier-1.pt"]
    loaded = load_model(tmp_path / "tier-1.pt").eval()
    # the tier's slice, its BatchNorm statistics re-estimated on the server's slice (issue 41)
    net = width_net(MNIST, 0.5, head)
    net.load_state_dict(arrays.to_torch_state_dict())
    refresh_batchnorm(net, load_server_data(settings.data))
    x = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(loaded(x), net.cpu().eval()(x))


def test_a_resumed_run_equals_the_uninterrupted_one(data_cache, tmp_path) -> None:
    """FjORD (per-batch widths from the seed): stopped before round 2 of 2, resumed from its
    checkpoint: the same tier models, history and training ledger."""
    from fedorasflwr.methods.widths.messages import WIDTHS_TRAIN
    from tests.test_checkpoints import (
        StoppingGrid,
        SuperLinkGoneError,
        assert_same_weights,
        result_of,
        run_main,
        stage_totals,
    )

    base = pyproject_run_config() | tiny(
        data_cache,
        "fjord",
        # a resume equals the run never stopped at any data size (the probe steps on the
        # server's slice, whatever the clients hold)
        **{"fjord.rounds": 2, "fjord.lr-probe": True, **FEW_ROWS},
    )

    def config(name: str, **extra):
        return {**base, "output-dir": str(tmp_path / name), "checkpoint-every": 1, **extra}

    whole = run_main(InProcessGrid(client_app, config("whole"), 4), config("whole"))
    grid = StoppingGrid(client_app, config("stopped"), 4, message_type=WIDTHS_TRAIN, stop=2)
    with pytest.raises(SuperLinkGoneError):
        run_main(grid, config("stopped"))
    (stopped,) = (tmp_path / "stopped").iterdir()
    resumed_config = config("resumed", **{"resume-from": str(stopped / "checkpoint.pt")})
    resumed = run_main(InProcessGrid(client_app, resumed_config, 4), resumed_config)
    for tier in range(1, 5):  # tier-<t>.pt, 1-based
        assert_same_weights(whole / f"tier-{tier}.pt", resumed / f"tier-{tier}.pt")
    first, second = result_of(whole), result_of(resumed)
    assert second["history"] == first["history"] and len(second["history"]) == 2
    # result.json records each round's training loss, so a collapse (issue 40: a loss stuck at
    # ln(classes)) shows in the run's own files
    assert all(0 < entry["train_loss"] < 100 for entry in first["history"])
    assert stage_totals(second, "train") == stage_totals(first, "train")
    assert second["tiers"] == first["tiers"]
    # the server's lr probe (issue 40) ran on its slice before round 1, from the configured
    # rate down, and a resumed run finds the same rate
    probe = first["lr_probe"]
    assert second["lr_probe"] == probe
    assert probe["tried"][0]["lr"] == probe["configured"] == base["fjord.lr"]
    assert probe["lr"] == probe["tried"][-1]["lr"] <= probe["configured"]
    assert probe["tried"][-1]["max_loss"] <= probe["bound"] or probe["lr"] == 0.05 / 32


class Smallest:
    """A stand-in generator whose every draw picks the ladder's first (smallest) width."""

    def integers(self, high: int) -> int:
        return 0


def test_self_distillation_trains_the_p_max_model_and_costs_its_flops(data_cache) -> None:
    """FjORD's self-distillation: a batch at a width below p_max also trains the p_max
    model (entries outside the sampled slice move too) and pays its FLOPs; without it
    they stay put (the test above)."""
    from fedorasflwr.data import load_client_data

    settings = parse_run_config(pyproject_run_config() | {"data.cache-dir": str(data_cache)})
    data = load_client_data(settings.data, 0, 20)
    base = {"width": 0.5, "widths": [0.25, 0.5], "width-macs": [1, 4], "local-epochs": 1,
            "batch-size": 32, "lr": 0.1, "momentum": 0.0}  # fmt: skip
    runs = {}
    for distill in (False, True):
        torch.manual_seed(0)
        net = width_net(MNIST, 0.5)
        before = {k: v.clone() for k, v in net.state_dict().items()}
        config = ConfigRecord({**base, "distill": distill})
        loss, seen, flops = ordered_dropout_sgd(
            net, partial(width_net, MNIST), data.train, config, (0, 1), Smallest()
        )
        runs[distill] = (before, net.state_dict(), loss, seen, flops)
    inner = width_shapes(MNIST, 0.25)["blocks.1.conv.weight"]
    for distill, (before, after, loss, seen, _flops) in runs.items():
        outside = torch.equal(before["blocks.1.conv.weight"][inner[0] :],
                              after["blocks.1.conv.weight"].cpu()[inner[0] :])  # fmt: skip
        assert outside is (not distill)
        assert seen == len(data.train) and np.isfinite(loss)
    assert runs[True][4] > runs[False][4]  # the teacher's forward and backward are paid


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_the_lr_probe_is_a_run_config_flag(method) -> None:
    settings = parse_run_config(pyproject_run_config() | {"method": method})
    assert settings.method_settings.lr_probe is True  # on by default
    config = pyproject_run_config() | {"method": method, f"{method}.lr-probe": False}
    assert parse_run_config(config).method_settings.lr_probe is False
    with pytest.raises(ValueError, match=f"'{method}.lr-probe' = 'yes'"):
        parse_run_config(pyproject_run_config() | {"method": method, f"{method}.lr-probe": "yes"})


def test_fjord_distill_is_a_run_config_flag_sent_to_the_clients() -> None:
    cfg = pyproject_run_config() | {"method": "fjord"}
    assert parse_run_config(cfg).method_settings.distill is False
    cfg["fjord.distill"] = True
    assert parse_run_config(cfg).method_settings.distill is True
    with pytest.raises(ValueError, match="fjord.distill"):
        parse_run_config(pyproject_run_config() | {"method": "fjord", "fjord.distill": "yes"})


def test_the_scaled_head_divides_the_classifier_input_by_the_root_of_its_positions() -> None:
    """``head="flatten-scaled"``: same weights as ``"flatten"``; MNIST's 28 px map ends at
    3x3 after three pools (28, 14, 7, 3), so each logit minus its bias is a third of the
    plain head's."""
    torch.manual_seed(0)
    plain = width_net(MNIST, 0.5).eval()
    scaled = width_net(MNIST, 0.5, "flatten-scaled").eval()
    assert width_shapes(MNIST, 0.5) == {k: tuple(v.shape) for k, v in scaled.state_dict().items()}
    scaled.load_state_dict(plain.state_dict())
    x = torch.randn(4, 1, 28, 28)
    bias = plain.classifier.bias
    torch.testing.assert_close((scaled(x) - bias) * 3, plain(x) - bias)
    with pytest.raises(ValueError, match="'gap'.*allowed: flatten, flatten-scaled"):
        width_net(MNIST, 0.5, "gap")


@pytest.mark.parametrize("method", ["heterofl", "fjord"])
def test_the_head_is_a_run_config_choice_sent_to_the_clients(method) -> None:
    """``<method>.head`` reaches the strategy's model and every message, and a client
    builds the net the message names (no ``head``: the paper's flatten head)."""
    from fedorasflwr.methods.widths.client import model_of

    settings = parse_run_config(pyproject_run_config() | {"method": method})
    assert settings.method_settings.head == "flatten-scaled"  # the default since 2026-12-07
    flatten = pyproject_run_config() | {"method": method, f"{method}.head": "flatten"}
    assert parse_run_config(flatten).method_settings.head == "flatten"
    # a checkpoint written before the key (the flatten head) binds none, so it resumes into a
    # flatten run; the scaled head is bound (bound_settings)
    assert f"{method}.head" not in bound_settings(method, parse_run_config(flatten).values)
    assert bound_settings(method, settings.values)[f"{method}.head"] == "flatten-scaled"
    from fedorasflwr.checkpoints import check_bound_settings

    before = bound_settings(method, parse_run_config(flatten).values)
    check_bound_settings("checkpoint.pt", before, before, method)  # resumes as flatten
    refused = rf"'{method}.head' = '\(absent\)' there, 'flatten-scaled' here"
    with pytest.raises(ValueError, match=refused):  # not into the new default
        check_bound_settings(
            "checkpoint.pt", before, bound_settings(method, settings.values), method
        )
    config = pyproject_run_config() | {"method": method, f"{method}.head": "flatten-scaled"}
    method_settings = parse_run_config(config).method_settings
    strategy_class = HeteroFL if method == "heterofl" else FjORD
    strategy = strategy_class(settings=method_settings, seed=0, image=MNIST)
    assert strategy.net.head_scale == pytest.approx(1 / 3)
    message_config = strategy.message_config(1, 0.5)
    assert message_config["head"] == "flatten-scaled"
    assert model_of(message_config)(0.5).head_scale == pytest.approx(1 / 3)
    assert model_of({k: v for k, v in message_config.items() if k != "head"})(1.0).head_scale == 1
    bad = pyproject_run_config() | {"method": method, f"{method}.head": "gap"}
    with pytest.raises(ValueError, match=f"'{method}.head' = 'gap'.*flatten-scaled"):
        parse_run_config(bad)


def test_the_console_points_at_the_scaled_head_when_the_probe_lowers_the_rate() -> None:
    from fedorasflwr.methods.widths.runner import head_hint
    from fedorasflwr.training import LrProbe

    lowered = LrProbe(0.0125, 0.05, 3.58, 48, ((0.05, 7.7), (0.025, 3.9), (0.0125, 2.7)))
    kept = LrProbe(0.05, 0.05, 3.58, 48, ((0.05, 2.9),))
    hint = head_hint("fjord", "flatten", lowered)
    assert hint is not None and 'fjord.head = "flatten-scaled"' in hint and "0.05" in hint
    assert head_hint("fjord", "flatten-scaled", lowered) is None  # already scaled
    assert head_hint("heterofl", "flatten", kept) is None  # the rate held
    assert head_hint("heterofl", "flatten", None) is None  # no probe ran
