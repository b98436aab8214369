"""GGEUR (or FedMC) added to a Flower app of your own, without fedsim's runner.

Your model, your data and Flower's own FedAvg strategy; fedsim adds the geometry in a few lines:

* server: build the augmenter, ``bind`` it to the run, and call ``serve_exchange`` once before
  ``strategy.start`` (the clients' class statistics go up, the global geometry comes down);
* client: answer the exchange's two message types with ``answer``, and in ``train`` add the
  augmenter's samples (``client_augmenter(...).augment``) to the rows you train on.

Run it in Flower's Simulation Engine with ``python examples/flower_exchange/app.py`` (2 rounds,
4 clients; tests/fedsim/test_flower.py runs it), or point ``flwr run`` at ``app:server`` / ``app:client``.
The data is synthetic: 6 Gaussian classes in 16 dimensions, each client holding 2 of them.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedsim.augmenters import ClientData, build_augmenter
from fedsim.flower.exchange import answer, client_augmenter, serve_exchange

N_CLIENTS, N_CLASSES, DIM, ROUNDS = 4, 6, 16, 2
# GGEUR, or FedMC under its one-time protocol: {"name": "fedmc-fixed", "target_per_class": 60}
# (FedMC's default, "fedmc" (Algorithm 1), exchanges every round: call serve_exchange(aug, round, clients, send) before
# each round's training, e.g. from a strategy's configure_train)
AUGMENTER = json.loads(os.environ.get("EXAMPLE_AUGMENTER", '{"name": "ggeur", "target_per_class": 60}'))


def blobs(n: int, classes: list[int], seed: int):
    """n unit-norm rows of the given classes (the class means are the same for everyone)."""
    means = torch.randn(N_CLASSES, DIM, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(classes)[torch.randint(0, len(classes), (n,), generator=g)]
    x = means[y] + 0.8 * torch.randn(n, DIM, generator=g)
    return x / x.norm(dim=1, keepdim=True), y


def my_data(cid: int) -> ClientData:
    x, y = blobs(40, [(2 * cid) % N_CLASSES, (2 * cid + 1) % N_CLASSES], seed=1 + cid)
    return ClientData(x, y)


def augmenter():
    kw = dict(AUGMENTER)
    aug = build_augmenter(kw.pop("name"), **kw)
    aug.rounds = ROUNDS
    aug.bind(n_classes=N_CLASSES, seed=0, dim=DIM, dtype=torch.float32)
    return aug


# ---------------------------------------------------------------------- client
client = ClientApp()


def _cid(context: Context) -> int:
    return int(context.node_config["partition-id"])


@client.query("hello")
def hello(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"hello": ConfigRecord({"cid": _cid(context)})}), reply_to=msg)


@client.query("upload")
@client.query("download")
def exchange(msg: Message, context: Context) -> Message:
    cid = _cid(context)
    return answer(msg, context, augmenter(), cid, my_data(cid))


@client.train()
def train(msg: Message, context: Context) -> Message:
    cid, data = _cid(context), my_data(_cid(context))
    round = int(msg.content["config"]["server-round"])
    aug = client_augmenter(augmenter(), cid, data, context)
    x_new, y_new = aug.augment(cid, data, generator=torch.Generator().manual_seed(1000 * round + cid))
    x, y = torch.cat([data.x, x_new.to(data.x.dtype)]), torch.cat([data.y, y_new])
    model = torch.nn.Linear(DIM, N_CLASSES)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    metrics = MetricRecord({"num-examples": int(data.x.shape[0]), "augmented": int(x_new.shape[0])})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


# ---------------------------------------------------------------------- server
server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    while len(ids := list(grid.get_node_ids())) < N_CLIENTS:  # the simulation's nodes
        time.sleep(0.2)
    hellos = grid.send_and_receive([Message(RecordDict(), dst_node_id=n, message_type="query.hello") for n in ids])
    nodes = {int(r.content["hello"]["cid"]): r.metadata.src_node_id for r in hellos}  # cid -> node id
    cids = {n: c for c, n in nodes.items()}

    def send(kind, contents):  # one message per client; the replies by client id
        msgs = [Message(c, dst_node_id=nodes[cid], message_type=kind) for cid, c in contents.items()]
        return {cids[r.metadata.src_node_id]: r.content for r in grid.send_and_receive(msgs) if not r.has_error()}

    aug = augmenter()
    serve_exchange(aug, None, sorted(nodes), send)  # the geometry exchange, once, before training

    x_test, y_test = blobs(600, list(range(N_CLASSES)), seed=99)

    def evaluate(round: int, arrays: ArrayRecord) -> MetricRecord:
        model = torch.nn.Linear(DIM, N_CLASSES)
        model.load_state_dict(arrays.to_torch_state_dict())
        acc = float((model(x_test).argmax(1) == y_test).float().mean())
        print(f"round {round}: test accuracy {acc:.3f}")
        return MetricRecord({"accuracy": acc})

    torch.manual_seed(0)
    strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=N_CLIENTS)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(torch.nn.Linear(DIM, N_CLASSES).state_dict()),
                            num_rounds=ROUNDS, evaluate_fn=evaluate)
    context.state["exchange"] = ConfigRecord({"up": aug.setup_bytes[0], "down": aug.setup_bytes[1]})
    print(f"exchange: {aug.setup_bytes[0]} bytes up, {aug.setup_bytes[1]} bytes down; "
          f"final accuracy {result.evaluate_metrics_serverapp[ROUNDS]['accuracy']:.3f}")


if __name__ == "__main__":
    from flwr.simulation import run_simulation

    run_simulation(server_app=server, client_app=client, num_supernodes=N_CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    sys.exit(0)
