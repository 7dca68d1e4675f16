"""Packed mode's layer (strategies.engine.packing) and mod (strategies.client.packing), in one
process: N virtual clients on W in-process SuperNodes, what a strategy sees, balance,
client state that follows the client, failures, hostile replies."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from strategies import contract as C
from strategies.client import NoReply, virtual_clients
from strategies.engine.event_loop import GridEventLoop
from strategies.engine.packed_records import put, take
from strategies.engine.packing import (
    PackedGrid,
    balance,
    task_cost,
    virtual_node_id,
    width_task_cost,
)
from tests.inprocess import InProcessGrid, adding_app, partition_facts
from tests.messages import record

N, W = 7, 3


def counting_app(raise_for: int | None = None, silent_for: int | None = None) -> ClientApp:
    """Partition p returns w + p + 1 and counts its calls in context.state; ``raise_for``
    raises, ``silent_for`` sends no reply."""
    app = ClientApp(mods=[virtual_clients])

    app.query()(partition_facts)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        assert context.node_config["num-partitions"] == N
        assert context.node_config[C.VIRTUAL_CLIENT] is True
        if pid == raise_for:
            raise RuntimeError(f"partition {pid} broke")
        if pid == silent_for:
            raise NoReply
        calls = context.state.get("calls", MetricRecord({"n": 0}))["n"] + 1
        context.state["calls"] = MetricRecord({"n": calls})
        w = msg.content[C.ARRAYS]["w"].numpy() + pid + 1
        return Message(RecordDict({C.ARRAYS: record({"w": w}), C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: 10 * (pid + 1), "calls": calls, "node": context.node_id})}),
            reply_to=msg)

    return app


def train_messages(grid, nodes, round_=1, steps=1):
    config = ConfigRecord({C.SERVER_ROUND: round_, C.LOCAL_STEPS: steps, C.BATCH_SIZE: 10})
    return [Message(RecordDict({C.ARRAYS: record({"w": np.zeros(2)}), C.CONFIG: config}),
                    dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]


def exchange(grid, messages, timeout=None):
    return GridEventLoop(grid, pull_interval=0).exchange(messages, timeout)


def packed(app=None, workers=W):
    inner = InProcessGrid(app or counting_app(), workers, {})
    return inner, PackedGrid(inner, N)


def test_the_strategy_sees_n_virtual_clients_and_one_reply_each():
    inner, grid = packed()
    nodes = list(grid.get_node_ids())
    assert nodes == [virtual_node_id(p) for p in range(N)] and nodes[0] == 1_000_000_000
    replies = exchange(grid, train_messages(grid, nodes))
    assert sorted(r.metadata.src_node_id for r in replies) == nodes
    for reply in replies:
        pid = reply.metadata.src_node_id - 1_000_000_000
        np.testing.assert_array_equal(reply.content[C.ARRAYS]["w"].numpy(), [pid + 1] * 2)
        assert reply.content[C.METRICS]["node"] == reply.metadata.src_node_id
    assert sorted(kind for _, kind in inner.calls) == ["train"] * W  # one message per worker
    assert sorted(grid.shares) == [2, 2, 3]


def test_replies_answer_their_own_messages():
    _, grid = packed()
    messages = train_messages(grid, list(grid.get_node_ids())[:3])
    ids = list(grid.push_messages(messages))
    replies = list(grid.pull_messages(ids))
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(ids)
    by_id = {m.metadata.message_id: m for m in messages}
    for reply in replies:
        asked = by_id[reply.metadata.reply_to_message_id]
        assert reply.metadata.src_node_id == asked.metadata.dst_node_id
        assert reply.metadata.message_type == MessageType.TRAIN


def test_client_state_follows_the_client_whichever_worker_serves_it():
    inner, grid = packed()
    nodes = list(grid.get_node_ids())
    for round_ in (1, 2, 3):
        # another number of workers' worth of shares each round: the assignment moves
        chosen = nodes if round_ != 2 else nodes[:4]
        replies = exchange(grid, train_messages(grid, chosen, round_))
        calls = {r.metadata.src_node_id: r.content[C.METRICS]["calls"] for r in replies}
        expected = {n: (round_ if round_ < 3 or n in nodes[:4] else 2) for n in chosen}
        assert calls == expected
    del inner


def test_balance_puts_the_longest_task_first_on_the_least_loaded_worker():
    assert balance([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert balance([1, 1, 1, 1], 3) == [[0, 3], [1], [2]]
    assert balance([], 2) == [[], []]
    assert balance([3, 3, 2, 2, 2], 2) == [[0, 2, 4], [1, 3]]  # loads 7 and 5


def test_task_cost_is_the_examples_a_task_trains_on():
    steps = train_messages(None, [1], steps=4)[0]
    assert task_cost(steps, 50) == 40.0
    epochs = train_messages(None, [1], steps=0)[0]
    epochs.content[C.CONFIG][C.LOCAL_EPOCHS] = 2
    assert task_cost(epochs, 50) == 100.0 and task_cost(epochs, None) == 1.0


def test_a_width_task_costs_its_examples_times_its_widths_compute_share():
    cost = width_task_cost({1.0: 1.0, 0.25: 0.158}.__getitem__)
    full, quarter, plain, bad = train_messages(None, [1, 2, 3, 4], steps=4)
    for message, width in ((full, 1.0), (quarter, 0.25), (bad, True)):
        message.content[C.CONFIG] = ConfigRecord({**message.content[C.CONFIG],
                                                  C.MODEL_WIDTH: width})
    assert cost(full, None) == 40.0 and cost(plain, None) == 40.0
    assert cost(quarter, None) == pytest.approx(40.0 * 0.158)
    assert cost(bad, None) == 40.0  # not a width: examples alone
    query = Message(RecordDict({C.CONFIG: ConfigRecord({})}), dst_node_id=1,
                    message_type=MessageType.QUERY)
    assert cost(query, None) == 1.0


def test_the_app_balances_a_width_strategys_packed_tasks_by_its_own_compute_shares():
    from types import SimpleNamespace

    from fedapp.server_app import packed as app_packed
    from strategies import FedAvg, HeteroFL
    from tests.test_width_strategies import kwargs

    strategy = HeteroFL(**kwargs(level_compute={1.0: 1.0, 0.5: 0.327}))
    cfg = SimpleNamespace(virtual_clients=N)
    grid = app_packed(InProcessGrid(counting_app(), W, {}), cfg, strategy)
    (message,) = train_messages(None, [1], steps=3)
    message.content[C.CONFIG] = ConfigRecord({**message.content[C.CONFIG], C.MODEL_WIDTH: 0.5})
    assert grid.cost(message, None) == pytest.approx(30.0 * 0.327)
    assert app_packed(InProcessGrid(counting_app(), W, {}), cfg, FedAvg()).cost(message, None) \
        == 30.0


def test_tasks_are_balanced_by_the_sizes_from_the_client_info_query():
    _, grid = packed(workers=2)
    nodes = list(grid.get_node_ids())
    query = [Message(RecordDict({C.CONFIG: ConfigRecord({})}), dst_node_id=n,
                     message_type=MessageType.QUERY) for n in nodes]
    exchange(grid, query)
    assert grid.examples == {n: 10 * (p + 1) for p, n in enumerate(nodes)}
    messages = train_messages(grid, nodes, steps=0)  # epochs: the cost is E n_k
    exchange(grid, messages)
    # sizes 10..70: LPT gives 70+40+30+(10) vs 60+50+20 -> shares of 4 and 3 clients
    assert sorted(grid.shares) == [3, 4]


def test_a_raising_virtual_client_gets_its_own_error_reply_and_the_others_go_on():
    _, grid = packed(counting_app(raise_for=2))
    replies = exchange(grid, train_messages(grid, list(grid.get_node_ids())))
    errors = [r for r in replies if r.has_error()]
    assert len(replies) == N and len(errors) == 1
    assert errors[0].metadata.src_node_id == virtual_node_id(2)
    assert "partition 2 broke" in errors[0].error.reason


def test_a_silent_virtual_client_is_lost_at_the_timeout_the_others_are_not():
    _, grid = packed(counting_app(silent_for=4))
    messages = train_messages(grid, list(grid.get_node_ids()))
    replies = exchange(grid, messages, timeout=0.05)
    assert sorted(r.metadata.src_node_id for r in replies) == \
        [virtual_node_id(p) for p in range(N) if p != 4]


def test_a_failed_worker_message_fails_each_of_its_virtual_clients_naming_the_worker():
    class Broken(InProcessGrid):
        def deliver(self, msg, timeout=None):
            if msg.metadata.dst_node_id == self.node_ids[0]:
                return Message(error=Error(code=8, reason="ClientApp crashed"), reply_to=msg)
            return super().deliver(msg, timeout)

    inner = Broken(counting_app(), 2, {})
    grid = PackedGrid(inner, N)
    replies = exchange(grid, train_messages(grid, list(grid.get_node_ids())))
    failed = [r for r in replies if r.has_error()]
    assert len(replies) == N and 0 < len(failed) < N
    assert all(f"SuperNode {inner.node_ids[0]}" in r.error.reason
               and "ClientApp crashed" in r.error.reason for r in failed)


def test_a_hostile_worker_cannot_answer_for_clients_it_was_not_sent(caplog):
    class Forging(InProcessGrid):
        def deliver(self, msg, timeout=None):
            reply = super().deliver(msg, timeout)
            put(reply.content, 99, C.PACKED_CONTENT, {C.METRICS: MetricRecord({"x": 1})})
            reply.content["junk"] = ConfigRecord({"a": 1})
            return reply

    grid = PackedGrid(Forging(counting_app(), 2, {}), N)
    replies = exchange(grid, train_messages(grid, list(grid.get_node_ids())))
    assert len(replies) == N and not any(r.has_error() for r in replies)
    assert "virtual client #99" in caplog.text and "junk" in caplog.text


def test_no_supernode_means_no_virtual_client_and_an_error_per_pushed_message():
    class Empty(InProcessGrid):
        def get_node_ids(self):
            return []

    grid = PackedGrid(Empty(counting_app(), 1, {}), N)
    assert list(grid.get_node_ids()) == []
    replies = exchange(grid, train_messages(grid, [virtual_node_id(0)]))
    assert replies[0].has_error() and "no SuperNode is connected" in replies[0].error.reason


def test_a_message_to_a_node_that_is_no_virtual_client_is_a_clear_error():
    _, grid = packed()
    with pytest.raises(ValueError, match=r"node 5 is not a virtual client .* 1000000006"):
        grid.push_messages(train_messages(grid, [5]))
    with pytest.raises(ValueError, match="num_clients=0"):
        PackedGrid(grid.grid, 0)


def test_put_and_take_split_records_by_virtual_client():
    pack = RecordDict({C.PACKED: ConfigRecord({"x": 1})})
    arrays = ArrayRecord([np.ones(2)])
    put(pack, 0, C.PACKED_CONTENT, {C.ARRAYS: arrays, "odd:name": ConfigRecord({"a": 1})})
    put(pack, 12, C.PACKED_STATE, {"c": MetricRecord({"n": 1})})
    pack["e3"] = ConfigRecord({C.PACKED_ERROR_CODE: 2, C.PACKED_ERROR_REASON: "no"})
    pack["v:bad"] = ConfigRecord({})
    parts, errors, unknown = take(pack)
    assert parts[0][C.PACKED_CONTENT][C.ARRAYS] is arrays
    assert set(parts[0][C.PACKED_CONTENT]) == {C.ARRAYS, "odd:name"}
    assert parts[12][C.PACKED_STATE]["c"]["n"] == 1
    assert set(errors) == {3} and unknown == ["v:bad"]


def test_an_unpacked_message_goes_to_the_handler_unchanged():
    app = counting_app()
    msg = train_messages(None, [1])[0]
    msg.metadata.__dict__["_message_id"] = "m1"
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                      node_config={"partition-id": 3, "num-partitions": N,
                                   C.VIRTUAL_CLIENT: True})
    reply = app(msg, context)
    np.testing.assert_array_equal(reply.content[C.ARRAYS]["w"].numpy(), [4, 4])


def test_the_trust_gate_refuses_one_virtual_clients_bad_reply_and_keeps_the_others(caplog):
    from strategies import FedAvg  # noqa: PLC0415

    grid = PackedGrid(InProcessGrid(adding_app(bad_partition=3, mods=[virtual_clients]), 2, {}),
                      N)
    strategy = FedAvg(query_client_info=True, weighting="uniform")
    result = strategy.start(grid=grid, initial_arrays=record({"w": np.zeros(2)}), num_rounds=1)
    w = result.arrays["w"].numpy()
    np.testing.assert_allclose(w, [np.mean([p + 1 for p in range(N) if p != 3])] * 2)
    assert f"Reply from node {virtual_node_id(3)} (partition 3) rejected" in caplog.text
    assert "NaN or Inf" in caplog.text


def test_a_workers_oversized_or_malformed_client_state_is_not_kept(caplog):
    """A worker that returns 16 MiB of Context.state for a virtual client whose model is 16
    bytes (the attack: 256 MiB each, held by the ServerApp and sent to the next worker), or
    a state array whose bytes are not its declared shape: the client keeps the state it
    had, the log names worker, client and cause, and nothing of it is held."""
    app = ClientApp(mods=[virtual_clients])
    app.query()(partition_facts)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        calls = context.state.get("calls", MetricRecord({"n": 0}))["n"] + 1
        context.state["calls"] = MetricRecord({"n": calls})
        if pid == 0:
            context.state["bloat"] = ArrayRecord({"x": Array(np.zeros(2 << 20))})  # 16 MiB
        return Message(RecordDict({C.ARRAYS: msg.content[C.ARRAYS], C.METRICS: MetricRecord(
            {C.NUM_EXAMPLES: 10, "calls": calls})}), reply_to=msg)

    class Malformed(InProcessGrid):
        def deliver(self, msg, timeout=None):
            reply = super().deliver(msg, timeout)
            if msg.content[C.PACKED][C.PACKED_PARTITION_IDS][0] != 0:
                bad = Array(dtype="float32", shape=(4,), stype="numpy.ndarray", data=b"\x93NUMPY")
                put(reply.content, 0, C.PACKED_STATE, {"bad": ArrayRecord({"x": bad})})
            return reply

    grid = PackedGrid(Malformed(app, 2, {}), N)
    nodes = list(grid.get_node_ids())
    for round_ in (1, 2):
        replies = exchange(grid, train_messages(grid, nodes, round_))
        calls = {r.metadata.src_node_id - nodes[0]: r.content[C.METRICS]["calls"]
                 for r in replies}
        assert calls[0] == 1  # its bloated state was not kept: it starts afresh each round
    kept = [p for p in range(N) if calls[p] == 2]
    refused = [p for p in range(1, N) if calls[p] == 1]  # first of the other worker's share
    assert kept and refused and sorted([0, *kept, *refused]) == list(range(N))
    assert all("bloat" not in state for state in grid.states.values())
    assert ("virtual client 1000000000 (partition 0): its Context.state holds more than "
            f"{8 * record({'w': np.zeros(2)}).count_bytes() + (1 << 20)} bytes") in caplog.text
    assert "keeps the Context.state it had" in caplog.text and "'bad' array 'x'" in caplog.text
