"""The shared PyTorch task: models, data, partitions, local solvers, evaluation.

Used by the ClientApp, the ServerApp's evaluation and the simulation tooling. Of
fedhetero's own code it imports only ``strategies.contract`` and ``strategies.client``
(the client side of the strategies' contracts: the local solver shares its minibatch
order with FedVeca's client helper). The client-side helpers a strategy needs (FedVeca,
DynamicFL, FedNova's step report, the client-info reply) live in ``strategies.client``,
not here, so that a user's project with its own ``task`` module can import them.
"""
