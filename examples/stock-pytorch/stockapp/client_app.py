"""ClientApp exactly in the style of Flower's PyTorch template: arrays, num-examples, train_loss."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from stockapp.task import Net, load_data
from stockapp.task import test as test_fn
from stockapp.task import train as train_fn

app = ClientApp()


@app.train()
def train(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                     context.run_config["data-dir"], context.run_config["max-examples"])
    train_loss = train_fn(model, x, y, context.run_config["local-epochs"],
                          msg.content["config"]["lr"], context.run_config["batch-size"])
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(y)}
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(context.node_config["partition-id"], context.node_config["num-partitions"],
                     context.run_config["data-dir"], context.run_config["max-examples"])
    loss, accuracy = test_fn(model, x, y)
    metrics = {"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(y)}
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
