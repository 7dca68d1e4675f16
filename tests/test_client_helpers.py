"""strategies.client: the client-info reply, FedNova's step report, FedProx's message test,
client state and carried optimiser state."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from strategies import contract as C
from strategies.client import (
    client_info_reply,
    is_client_info_query,
    is_fedprox_message,
    load_arrays,
    load_meta,
    loader_steps,
    report_local_steps,
    save_arrays,
)


@pytest.fixture(autouse=True)
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def query_message(asked: str = C.QUERY_CLIENT_INFO) -> Message:
    content = RecordDict({C.CONFIG: ConfigRecord({C.QUERY: asked})})
    return Message(content=content, message_type=MessageType.QUERY, dst_node_id=5)


def test_client_info_reply_carries_the_contract_keys():
    msg = query_message()
    assert is_client_info_query(msg)
    reply = client_info_reply(msg, partition_id=3, num_examples=120, label_counts=[100, 20],
                              comm_budget=5e7)
    metrics = reply.content[C.METRICS]
    assert metrics[C.PARTITION_ID] == 3 and metrics[C.NUM_EXAMPLES] == 120
    assert list(metrics[C.LABEL_COUNTS]) == [100, 20] and metrics[C.COMM_BUDGET] == 5e7
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    minimal = client_info_reply(msg, partition_id=0, num_examples=1).content[C.METRICS]
    assert set(minimal) == {C.PARTITION_ID, C.NUM_EXAMPLES}


def test_client_info_reply_errors_name_the_value():
    with pytest.raises(ValueError, match="other-question"):
        client_info_reply(query_message("other-question"), partition_id=0, num_examples=1)
    with pytest.raises(ValueError, match="comm_budget"):
        client_info_reply(query_message(), partition_id=0, num_examples=1, comm_budget=0)
    with pytest.raises(ValueError, match="label_counts"):
        client_info_reply(query_message(), partition_id=0, num_examples=1, label_counts=[-1])


def test_report_local_steps():
    metrics = {C.NUM_EXAMPLES: 10}
    out = report_local_steps(metrics, 7)
    assert out == {C.NUM_EXAMPLES: 10, C.LOCAL_STEPS_TAKEN: 7} and metrics == {C.NUM_EXAMPLES: 10}
    assert report_local_steps(metrics, 7, a_norm=5.5)[C.A_NORM] == 5.5
    for bad in (0, 2.5):
        with pytest.raises(ValueError, match="local_steps"):
            report_local_steps(metrics, bad)
    with pytest.raises(ValueError, match="a_norm"):
        report_local_steps(metrics, 3, a_norm=math.inf)


@pytest.mark.parametrize("n, b, drop_last, epochs", [
    (10, 3, False, 2), (10, 3, True, 2), (9, 3, False, 1), (2, 5, False, 3),
])
def test_loader_steps_counts_what_a_stock_loop_takes(n, b, drop_last, epochs):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(n, 1)),
                                         batch_size=b, drop_last=drop_last)
    taken = sum(1 for _ in range(epochs) for _ in loader)
    assert loader_steps(loader, epochs) == taken
    assert taken == epochs * (n // b if drop_last else math.ceil(n / b))


def test_state_round_trip_across_messages():
    """Arrays and scalars saved in Context.state come back equal (as SCAFFOLD's c_i would)."""
    state = RecordDict()
    assert load_arrays(state, "scaffold-c") is None and load_meta(state, "scaffold-c") is None
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": torch.ones(3)}
    save_arrays(state, "scaffold-c", arrays, meta={"round": 4})
    back = load_arrays(state, "scaffold-c")
    np.testing.assert_array_equal(back["w"], arrays["w"])
    np.testing.assert_array_equal(back["b"], np.ones(3, dtype=np.float32))
    back["w"][0, 0] = 99.0  # writable copies: the stored record is unchanged
    assert load_arrays(state, "scaffold-c")["w"][0, 0] == 0.0
    assert load_meta(state, "scaffold-c") == {"round": 4}
    save_arrays(state, "scaffold-c", {})  # nothing to keep: forgotten
    assert load_arrays(state, "scaffold-c") is None and load_meta(state, "scaffold-c") is None


def test_writable_tensor_copies_read_only_arrays_only():
    import warnings  # noqa: PLC0415

    from strategies.client.data import writable_tensor  # noqa: PLC0415

    read_only = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not read_only.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" UserWarning would raise
        tensor = writable_tensor(read_only)
    assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0]
    writable = np.ones(3, dtype=np.float32)
    shared = writable_tensor(writable)
    shared[0] = 5.0
    assert writable[0] == 5.0  # a writable array is shared, not copied
    already = torch.zeros(2)
    assert writable_tensor(already) is already


def test_is_fedprox_message_reads_flowers_key():
    def train(config):
        return Message(content=RecordDict({C.CONFIG: ConfigRecord(config)}),
                       message_type=MessageType.TRAIN, dst_node_id=5)

    assert is_fedprox_message(train({C.PROXIMAL_MU: 0.01, C.LR: 0.1}))
    assert not is_fedprox_message(train({C.LR: 0.1}))


def test_optimizer_state_round_trip_and_errors():
    """SGD's momentum buffers out as named arrays and into a fresh optimiser, bit for bit;
    state of a parameter the optimiser does not hold is refused by name."""
    from strategies.client.optimizer_state import (  # noqa: PLC0415
        load_optimizer_state, optimizer_state_arrays)

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    first = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    first.step()
    arrays = optimizer_state_arrays(first, model)
    assert set(arrays) == {"weight/momentum_buffer", "bias/momentum_buffer"}
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    load_optimizer_state(fresh, model, arrays)
    for p in model.parameters():
        assert torch.equal(fresh.state[p]["momentum_buffer"], first.state[p]["momentum_buffer"])
    with pytest.raises(ValueError, match="'head/momentum_buffer' names a parameter 'head'"):
        load_optimizer_state(fresh, model, {"head/momentum_buffer": np.zeros(2)})
    other = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="parameter the model does not have"):
        optimizer_state_arrays(first, other)
