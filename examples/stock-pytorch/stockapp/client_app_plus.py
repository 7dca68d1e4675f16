"""The template's ClientApp plus the client contract of FedVeca and DynamicFL.

To use FedVeca or DynamicFL, point ``clientapp`` in pyproject.toml at
``stockapp.client_app_plus:app``. Everything else is the template's own code
(``client_app.py``, unchanged): fedhetero's ``task`` helpers do the strategy-specific work.
"""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from stockapp.client_app import evaluate as template_evaluate
from stockapp.client_app import train as template_train
from stockapp.task import Net, load_data
from task.chunked import dynamicfl_train, is_dynamicfl_chunk, label_counts
from task.fedveca import fedveca_reply, is_fedveca_round
from task.train import client_seed

app = ClientApp()
app.evaluate()(template_evaluate)


def local_data(context: Context):
    node, run = context.node_config, context.run_config
    return load_data(node["partition-id"], node["num-partitions"], run["data-dir"], run["max-examples"])


@app.train()
def train(msg: Message, context: Context):
    config = msg.content["config"]
    if not (is_fedveca_round(config) or is_dynamicfl_chunk(config)):
        return template_train(msg, context)  # FedAvg, FedProx, FedNova: the template's training
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = local_data(context)
    partition_id = context.node_config["partition-id"]
    if is_fedveca_round(config):  # tau plain-SGD steps, the local gradient, beta, delta
        seed = client_seed(0, int(config["server-round"]), partition_id)  # a fresh batch order each round
        return Message(fedveca_reply(model, x, y, config, seed=seed), reply_to=msg)
    r = dynamicfl_train(model, x, y, config, context.state, partition_id=partition_id)  # one chunk
    metrics = {"train_loss": r.train_loss, "num-examples": r.num_examples}
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


@app.query()
def query(msg: Message, context: Context):
    """Partition id (reproducible sampling) and label histogram (DynaComm)."""
    _, y = local_data(context)
    metrics = {"partition-id": context.node_config["partition-id"], "num-examples": len(y),
               "label-counts": label_counts(y, num_classes=10)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
