"""The client side of every fedhetero strategy's contract, for any Flower ClientApp.

Each helper takes what a ClientApp already has (the received message or its config, a
torch model, the local data, ``context.state``) and returns what the strategy expects
back. torch is imported inside the helpers, so ``import strategies.client`` works where
torch is not installed.

=================  ================================================  ======================
strategy           what the ClientApp adds                           helper
=================  ================================================  ======================
every strategy     ``@app.query()`` answering the client-info query  ``client_info_reply``
FedAvg             nothing (a stock ClientApp works unchanged)       --
FedProx            optional: mu (w - w^t) on every gradient (a       ``ProximalTerm``
                   stock ClientApp runs FedAvg's local steps)
FedNova            the steps it took, in its reply metrics           ``report_local_steps``
FedVeca            tau steps + grad, beta, delta                     ``fedveca_train``
DynamicFL          one chunk of the round's batch stream             ``train_chunk``
SCAFFOLD           a correction after every step, option II          ``ScaffoldClient``
FedDyn             the regulariser's gradient before every step      ``FedDynClient``
MOON               l_sup + mu l_con (Eq. 4) in the loop              ``MoonClient``
HeteroFL /         build the model at the sent width, load the       ``width_model``
FedRolex           sub-model
FjORD              ordered dropout steps                             ``ordered_dropout_sgd``
client state       named arrays in ``Context.state`` across rounds   ``save_arrays``,
                                                                     ``load_arrays``
packed mode        ``ClientApp(mods=[virtual_clients])``: one call   ``virtual_clients``
                   serves a share of virtual clients; with           ``packed_clients``,
                   ``packed_clients(train_share)`` the share's       ``vectorised_sgd``
                   train work in one batched computation
restorable state   state the server can restore (SCAFFOLD's c_i,     ``resolve_state``,
                   FedDyn's linear term, MOON's previous model):     ``save_state``
                   resume, lost replies, restarts
=================  ================================================  ======================

The helpers wrap the optimiser you built (momentum, Adam, weight decay, a schedule) instead
of replacing it: ``ProximalTerm``, ``ScaffoldClient`` and ``FedDynClient`` install
themselves on it (``wrap(optimizer)``: a step hook of that optimiser), ``fedveca_train``
and ``train_chunk`` run it (``optimizer=``; plain SGD from the config without one), and
each takes your reply metrics (``finish(model, metrics)``, ``metrics=``) and adds its own.
Every local step they run goes through one loop, :func:`sgd_steps` (:func:`local_sgd` for
E epochs or a fixed number of steps), which fedhetero's own ClientApp runs too.

Restorable client state (:mod:`strategies.engine.client_states` on the server,
:func:`resolve_state` / :func:`save_state` here): every train message carries
``state-round``, the round whose accepted reply produced the state the server holds for
this client (0 = initial), and, when the server cannot be sure the node holds it, the
server's copy as the ArrayRecord ``client-state``. ``resolve_state`` returns, in this
order, the attached copy (and installs it), the initial state for round 0, the saved
state if its round matches, else raises ``ClientStateLost`` (the reply becomes an error;
the next message carries the copy). After training, ``save_state(state, key, new,
server_round)``; the reply reports ``state-round`` and ``state-digest``
(:func:`strategies.engine.client_states.state_digest`) of the state it started from, and the
server derives its copy from the reply the same way the client derives its own.
"""

from .batches import batch_indices, batch_stream, client_seed
from .data import as_tensors
from .dynamicfl import is_dynamicfl_chunk, train_chunk
from .feddyn import FedDynClient, is_feddyn_message
from .fednova import loader_steps, report_local_steps
from .fedprox import ProximalTerm, is_fedprox_message
from .fedveca import fedveca_train, is_fedveca_round
from .info import client_info_reply, is_client_info_query, label_counts
from .moon import (MissingRepresentation, MoonClient, contrastive_loss, has_representation,
                   is_moon_message)
from .packing import NoReply, is_packed, packed_clients, virtual_clients
from .scaffold import ScaffoldClient, is_scaffold_message
from .sgd_loop import LocalResult, local_sgd, sgd_steps
from .width import (is_width_message, load_width_state, ordered_dropout_sgd, sent_levels,
                    sent_scaler, sent_width, width_model)
from .state import (ClientStateLost, clear_arrays, load_arrays, load_meta, resolve_state,
                    save_arrays, save_state)

__all__ = [
    "ClientStateLost", "FedDynClient", "LocalResult", "MissingRepresentation", "MoonClient",
    "ProximalTerm", "ScaffoldClient", "as_tensors", "batch_indices", "batch_stream",
    "clear_arrays", "client_info_reply", "client_seed", "contrastive_loss", "fedveca_train",
    "has_representation", "is_client_info_query", "is_dynamicfl_chunk", "is_feddyn_message",
    "is_fedprox_message", "is_fedveca_round", "is_moon_message", "is_scaffold_message",
    "NoReply", "is_packed", "packed_clients", "label_counts", "load_arrays", "load_meta", "loader_steps", "local_sgd",
    "report_local_steps", "resolve_state", "save_arrays", "save_state", "sgd_steps",
    "train_chunk", "virtual_clients", "is_width_message", "load_width_state",
    "ordered_dropout_sgd", "sent_levels", "sent_scaler", "sent_width", "width_model",
]
