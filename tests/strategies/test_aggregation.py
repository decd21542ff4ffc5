"""OPA against hand-computed values and against Flower's own FedAvg."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedorasflwr.federation.aggregation import opa


def record(**arrays: np.ndarray) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def test_opa_equals_fedavg_when_every_key_is_counted_by_examples():
    rng = np.random.default_rng(0)
    current = record(w=np.zeros((3, 4), np.float32), b=np.zeros(4, np.float32))
    updates, contents = [], []
    for n in (10, 30, 60):
        update = record(
            w=rng.normal(size=(3, 4)).astype(np.float32), b=rng.normal(size=4).astype(np.float32)
        )
        updates.append((update, n))
        contents.append(
            RecordDict({"arrays": update, "metrics": MetricRecord({"num-examples": n})})
        )
    ours = opa(current, updates)
    flower = aggregate_arrayrecords(contents, "num-examples")
    for key in ("w", "b"):
        np.testing.assert_allclose(ours[key].numpy(), flower[key].numpy(), atol=1e-6)


def test_per_key_counts_weight_each_key_independently():
    current = record(a=np.zeros(2), b=np.full(2, 7.0), c=np.full(2, -1.0))
    updates = [
        (record(a=np.array([1.0, 1.0]), b=np.array([0.0, 0.0])), {"a": 1, "b": 3}),
        (record(a=np.array([4.0, 4.0]), b=np.array([8.0, 8.0])), {"a": 2, "b": 1}),
        (record(c=np.array([5.0, 5.0])), {"c": 9}),
    ]
    out = opa(current, updates)
    np.testing.assert_allclose(out["a"].numpy(), [3.0, 3.0])  # (1*1 + 2*4) / 3
    np.testing.assert_allclose(out["b"].numpy(), [2.0, 2.0])  # (3*0 + 1*8) / 4
    np.testing.assert_allclose(out["c"].numpy(), [-1.0, -1.0])  # one client only: kept


def test_key_updated_by_one_client_keeps_old_value_and_zero_counts_do_not_count():
    current = record(x=np.array([1.0, 2.0]))
    updates = [
        (record(x=np.array([9.0, 9.0])), {"x": 5}),
        (record(x=np.array([3.0, 3.0])), {"x": 0}),
    ]
    np.testing.assert_array_equal(opa(current, updates)["x"].numpy(), [1.0, 2.0])
    # with the privacy rule relaxed, the single contributor moves the key
    relaxed = opa(current, updates, min_contributors=1)
    np.testing.assert_array_equal(relaxed["x"].numpy(), [9.0, 9.0])


def test_integer_buffers_are_rounded_and_keep_their_dtype():
    current = record(n=np.array(0, np.int64))
    out = opa(
        current, [(record(n=np.array(10, np.int64)), 1), (record(n=np.array(13, np.int64)), 2)]
    )
    assert out["n"].numpy().dtype == np.int64
    assert int(out["n"].numpy()) == 12  # (10 + 26) / 3


def test_current_is_not_modified():
    current = record(x=np.array([1.0]))
    opa(current, [(record(x=np.array([3.0])), 1), (record(x=np.array([5.0])), 1)])
    np.testing.assert_array_equal(current["x"].numpy(), [1.0])


def test_unknown_key_shape_mismatch_and_negative_counts_raise():
    current = record(x=np.zeros(2))
    with pytest.raises(ValueError, match="unknown key 'y'"):
        opa(current, [(record(y=np.zeros(2)), 1)])
    with pytest.raises(ValueError, match="shape"):
        opa(current, [(record(x=np.zeros(3)), 1)])
    with pytest.raises(ValueError, match="negative"):
        opa(current, [(record(x=np.zeros(2)), {"x": -1})])


def test_public_api_imports_as_design_says():
    from flwr.serverapp.strategy import Strategy

    from fedorasflwr.clients import decnas, dpfnas, fdnas, fednas, fedoras
    from fedorasflwr.search_spaces import SearchSpace, build_space  # noqa: F401
    from fedorasflwr.strategies import CFDNAS, DPFNAS, FDNAS, DecNAS, FedNAS, FedorAS
    from fedorasflwr.strategies import opa as public_opa

    for strategy in (FedorAS, DecNAS, FDNAS, CFDNAS, DPFNAS, FedNAS):
        assert issubclass(strategy, Strategy)
    assert public_opa is opa
    clients = {
        "decnas": decnas,
        "dpfnas": dpfnas,
        "fdnas": fdnas,
        "fednas": fednas,
        "fedoras": fedoras,
    }
    for method, client in clients.items():
        assert client.__name__ == f"fedorasflwr.methods.{method}.client"
