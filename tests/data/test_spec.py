"""DataSpec: validation, run-config round trip, early partitionability checks, dataset_info."""

from __future__ import annotations

import pytest

from fedorasflwr.data import DataSpec, dataset_info, load_client_data
from fedorasflwr.data.groups import default_class_groups, even_sizes, parse_class_groups


def test_defaults_are_valid_and_round_trip() -> None:
    spec = DataSpec()
    config = spec.to_config()
    assert config["dataset"] == "mnist5k"
    assert config["val-fraction"] == 0.1
    assert set(config) == {
        "dataset",
        "partitioner",
        "alpha",
        "partition-size",
        "class-groups",
        "val-fraction",
        "test-fraction",
        "server-fraction",
        "global-test",
        "global-test-fraction",
        "seq-len",
        "seed",
        "cache-dir",
    }
    assert DataSpec.from_config(config) == spec


def test_from_config_accepts_flattened_run_config() -> None:
    cfg = {
        "data.dataset": "pydoc-topics",
        "data.partitioner": "natural",
        "data.alpha": 1,  # TOML int for a float field
        "data.seq-len": 40,
        "data.seed": 7,
        "method": "fedoras",  # other sections of the run config are ignored
        "fedoras.rounds": 3,
    }
    spec = DataSpec.from_config(cfg)
    assert spec == DataSpec(
        dataset="pydoc-topics", partitioner="natural", alpha=1.0, seq_len=40, seed=7
    )
    assert isinstance(spec.alpha, float)


def test_from_config_prefixed_key_wins() -> None:
    assert DataSpec.from_config({"seed": 1, "data.seed": 2}).seed == 2


def test_from_config_rejects_unknown_data_key() -> None:
    with pytest.raises(ValueError, match=r"data\.alpah"):
        DataSpec.from_config({"data.alpah": 0.1})


def test_from_config_rejects_wrong_types() -> None:
    with pytest.raises(ValueError, match=r"data\.seq-len"):
        DataSpec.from_config({"data.seq-len": 2.5})
    with pytest.raises(ValueError, match=r"data\.alpha"):
        DataSpec.from_config({"data.alpha": "big"})


@pytest.mark.parametrize(
    ("kwargs", "key", "hint"),
    [
        ({"dataset": "mnist"}, "data.dataset", "mnist5k, pydoc-topics, cifar10"),
        ({"dataset": "folder:"}, "data.dataset", "folder:<path>"),
        ({"partitioner": "lda"}, "data.partitioner", "iid, dirichlet, class-groups, natural"),
        ({"partitioner": "natural"}, "data.partitioner", "no natural ids"),
        ({"partitioner": "natural", "dataset": "cifar10"}, "data.partitioner", "no natural"),
        ({"dataset": "pydoc-topics", "partitioner": "dirichlet"}, "data.partitioner", "iid"),
        ({"dataset": "shakespeare", "partitioner": "class-groups"}, "data.partitioner", "iid"),
        ({"alpha": 0.0}, "data.alpha", "> 0"),
        ({"alpha": -1.0}, "data.alpha", "> 0"),
        ({"alpha": float("inf")}, "data.alpha", "> 0"),
        ({"val_fraction": 1.0}, "data.val-fraction", "[0, 1)"),
        ({"test_fraction": -0.1}, "data.test-fraction", "[0, 1)"),
        ({"server_fraction": 1.5}, "data.server-fraction", "[0, 1)"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "data.val-fraction", "< 1"),
        ({"class_groups": "0,1;;2"}, "data.class-groups", "separated by ';'"),
        ({"class_groups": "0,1;1,2"}, "data.class-groups", "one group only"),
        ({"class_groups": "0,a"}, "data.class-groups", "non-negative integers"),
        ({"class_groups": "0,1;10"}, "data.class-groups", "0..9"),
        ({"seq_len": 0}, "data.seq-len", ">= 1"),
        ({"dataset": "shakespeare", "partitioner": "natural", "seq_len": 81}, "data.seq-len", "80"),
        ({"seed": -1}, "data.seed", "2**32"),
    ],
)
def test_invalid_values_name_key_value_and_allowed(
    kwargs: dict[str, object], key: str, hint: str
) -> None:
    with pytest.raises(ValueError) as info:
        DataSpec(**kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"'{key}'" in message
    assert hint in message
    value = next(iter(kwargs.values())) if len(kwargs) == 1 else None
    if value is not None:
        assert repr(value) in message


def test_check_partitionable_num_partitions() -> None:
    spec = DataSpec(partitioner="iid")
    spec.check_partitionable(1)
    spec.check_partitionable(1500)  # 4,500 client samples, 3 each
    for bad in (0, -3):
        with pytest.raises(ValueError, match=r"num-partitions = -?\d+ is invalid"):
            spec.check_partitionable(bad)
    with pytest.raises(ValueError, match=r"num-partitions = 1501 is too many.*mnist5k.*<= 1500"):
        spec.check_partitionable(1501)
    with pytest.raises(ValueError, match="num-partitions"):
        spec.check_partitionable(2.0)  # type: ignore[arg-type]


def test_check_partitionable_more_partitions_than_topics() -> None:
    spec = DataSpec(dataset="pydoc-topics", partitioner="natural")
    spec.check_partitionable(79)
    with pytest.raises(ValueError, match=r"num-partitions = 80 .*79 natural ids"):
        spec.check_partitionable(80)


def test_check_partitionable_topic_too_short_for_seq_len() -> None:
    spec = DataSpec(dataset="pydoc-topics", partitioner="natural", seq_len=150)
    with pytest.raises(ValueError, match=r"'data\.seq-len' = 150"):
        spec.check_partitionable(79)


def test_check_partitionable_class_groups() -> None:
    spec = DataSpec(partitioner="class-groups")
    spec.check_partitionable(3)
    with pytest.raises(ValueError, match=r"num-partitions = 2 is too few.*'data\.class-groups'"):
        spec.check_partitionable(2)
    lopsided = DataSpec(partitioner="class-groups", class_groups="0;1;2,3,4,5,6,7,8,9")
    lopsided.check_partitionable(300)  # class 0: 450 samples over 100 clients
    with pytest.raises(ValueError, match=r"num-partitions = 600 is too many for class group"):
        lopsided.check_partitionable(600)  # 450 samples over 200 clients: 2 < 3 each


def test_partition_id_out_of_range_fails_before_loading(tmp_path) -> None:
    spec = DataSpec(cache_dir=str(tmp_path))
    for bad in (-1, 5):
        with pytest.raises(ValueError, match=r"partition-id = -?\d+ is out of range.*\[0, "):
            load_client_data(spec, bad, 5)
    assert not any(tmp_path.iterdir())


def test_dataset_info_is_cheap_and_right() -> None:
    mnist = dataset_info(DataSpec())
    assert (mnist.kind, mnist.num_classes, mnist.input_shape, mnist.vocab) == (
        "image",
        10,
        (1, 28, 28),
        None,
    )
    text = dataset_info(DataSpec(dataset="pydoc-topics", partitioner="iid", seq_len=32))
    assert (text.kind, text.num_classes, text.input_shape) == ("text", 98, (32,))
    assert text.vocab is not None and len(text.vocab) == 97
    assert dataset_info(DataSpec(dataset="cifar100")).num_classes == 100
    assert dataset_info(DataSpec(dataset="cifar10")).input_shape == (3, 32, 32)
    speech = dataset_info(DataSpec(dataset="speech-commands", partitioner="natural"))
    assert (speech.kind, speech.num_classes, speech.input_shape) == ("image", 35, (1, 40, 51))
    shakespeare = dataset_info(DataSpec(dataset="shakespeare", partitioner="natural"))
    assert (shakespeare.kind, shakespeare.num_classes) == ("text", 98)


def test_class_group_helpers() -> None:
    assert even_sizes(10, 3) == [3, 3, 4]
    assert even_sizes(9, 3) == [3, 3, 3]
    assert default_class_groups(10) == ((0, 1, 2), (3, 4, 5), (6, 7, 8, 9))
    assert parse_class_groups(" 0, 1 ;2") == ((0, 1), (2,))
