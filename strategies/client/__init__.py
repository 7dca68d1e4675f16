"""The client side of every fedhetero strategy's contract, for any Flower ClientApp.

Each helper takes what a ClientApp already has (the received message or its config, a
torch model, the local data, ``context.state``) and returns what the strategy expects
back. torch is imported inside the helpers, so ``import strategies.client`` works where
torch is not installed.

=================  ===============================================  ======================
strategy           what the ClientApp adds                          helper
=================  ===============================================  ======================
every strategy     ``@app.query()`` answering the client-info query  ``client_info_reply``
FedAvg, FedProx    nothing (a stock ClientApp works unchanged)      --
FedNova            the steps it took, in its reply metrics          ``report_local_steps``
FedVeca            tau plain-SGD steps + grad, beta, delta          ``fedveca_train``
DynamicFL          one chunk of the round's batch stream            ``train_chunk``
client state       named arrays in ``Context.state`` across rounds  ``save_arrays``,
(SCAFFOLD, FedDyn)                                                  ``load_arrays``
=================  ===============================================  ======================
"""

from .batches import batch_indices, batch_stream, client_seed
from .data import as_tensors
from .dynamicfl import is_dynamicfl_chunk, train_chunk
from .fednova import loader_steps, report_local_steps
from .fedveca import fedveca_train, is_fedveca_round
from .info import client_info_reply, is_client_info_query, label_counts
from .state import clear_arrays, load_arrays, load_meta, save_arrays

__all__ = [
    "as_tensors", "batch_indices", "batch_stream", "clear_arrays", "client_info_reply",
    "client_seed", "fedveca_train", "is_client_info_query", "is_dynamicfl_chunk",
    "is_fedveca_round", "label_counts", "load_arrays", "load_meta", "loader_steps",
    "report_local_steps", "save_arrays", "train_chunk",
]
