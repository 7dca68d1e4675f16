"""The contracts: every key a strategy sends and reads, and every run-log key it writes.

This module is the only place where these strings are spelled out. Server and
client code, the run log, reports, plots, the README table and the tests all import
the names from here. Run-log keys are the ``LOG_*`` names at the end.

Server -> client (ConfigRecord ``"config"`` of a train / evaluate / query message)
Client -> server (MetricRecord ``"metrics"`` and ArrayRecord ``"arrays"`` of a reply)

Besides the keys, one piece of arithmetic both sides must agree on: :func:`steps_for_epochs`,
the local steps that ``local-epochs`` E means (the server plans FedNova's tau_i and the
stragglers' work with it; the clients' local-SGD loop runs it). And the run-log record's
shape: a round's report is made of :class:`Section` dataclasses whose fields name their
``LOG_*`` key through :func:`logged`.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction

# Record names inside a Message's RecordDict (Flower's own defaults).
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# --- server -> client: ConfigRecord "config" ------------------------------------
SERVER_ROUND = "server-round"  # int, injected every round (Flower's key)
ASYNC_TASK = "async-task"  # int, an asynchronous task's number (1, 2, ...): seeds its batches
LR = "lr"  # float, local learning rate of this round (lr_t under a schedule)
LOCAL_EPOCHS = "local-epochs"  # number > 0 (fractions allowed), used when LOCAL_STEPS is 0
LOCAL_STEPS = "local-steps"  # int >= 0; > 0 means "exactly this many SGD steps"
BATCH_SIZE = "batch-size"  # int >= 0; 0 means full local batch (B = inf)
MOMENTUM = "momentum"  # float in [0, 1)
WEIGHT_DECAY = "weight-decay"  # float >= 0
PROXIMAL_MU = "proximal-mu"  # float >= 0 (Flower's FedProx key)
SEED = "seed"  # int, run seed; clients derive (seed, round, partition) streams


def steps_for_epochs(num_examples: int, batch_size: int, epochs: float) -> int:
    """tau_i = floor(E n_i / B) local steps, at least 1; B = 0 or B >= n_i gives floor(E).

    What ``local-epochs`` E means in this contract: a stream of minibatches of exactly B
    (McMahan et al. 2017, Alg. 1's ClientUpdate as fedhetero runs it,
    :func:`strategies.client.local_sgd`), not whole passes. E may be any number > 0; a
    fraction of an epoch is taken as the decimal it prints as, so no float rounding moves
    the floor (0.57 * 100 gives 57, not 56). 0 for n_i <= 0 or E <= 0.
    """
    if num_examples <= 0 or epochs <= 0:
        return 0
    if batch_size <= 0 or batch_size >= num_examples:
        return max(1, math.floor(epochs))
    if isinstance(epochs, int):
        return max(1, (epochs * num_examples) // batch_size)
    return max(1, math.floor(Fraction(repr(float(epochs))) * num_examples / batch_size))


# Query messages ask for client facts before sampling.
QUERY = "query"  # str, what is asked
QUERY_CLIENT_INFO = "client-info"  # value of QUERY: partition id + dataset size

# --- client -> server: MetricRecord "metrics" ------------------------------------
NUM_EXAMPLES = "num-examples"  # int > 0 (Flower's weighting key)
TRAIN_LOSS = "train-loss"  # float, mean minibatch loss over the local steps
STOCK_TRAIN_LOSS = "train_loss"  # what Flower's PyTorch template sends instead
LOCAL_STEPS_TAKEN = "local-steps"  # int, SGD steps actually taken (tau_i)
A_NORM = "a-norm"  # float, FedNova's ||a_i||_1 when the local solver is not (momentum/proximal) SGD
PARTITION_ID = "partition-id"  # int, the client's data partition (node config)
LABEL_COUNTS = "label-counts"  # list[int], label histogram (query reply)
EVAL_LOSS = "eval-loss"  # float, evaluate reply
EVAL_ACCURACY = "eval-accuracy"  # float, evaluate reply

# --- width-heterogeneous sub-models (HeteroFL, FjORD, FedRolex; strategies/engine/submodels.py) ---
# server -> client, per node (ConfigRecord "config"); the ArrayRecord "arrays" is the
# client's sub-model, the shapes of the ClientApp's model built at MODEL_WIDTH
MODEL_WIDTH = "model-width"  # float in (0, 1], the width r the client builds its model at
WIDTH_SCALER = "width-scaler"  # bool, HeteroFL: build the model with its Scaler (divide by r in training)
WIDTH_LEVELS = "width-levels"  # list[float], FjORD: the ordered-dropout widths p <= r a step samples
# client -> server: the sub-model in "arrays" (same keys and shapes as sent), NUM_EXAMPLES

# --- FedVeca (strategies/algorithms/fedveca.py; docs/strategies/fedveca.md) ----------------------------
# server -> client, per node (ConfigRecord "config"): LOCAL_STEPS is this client's tau_(k,i)
# float, ||grad F(w_{k-1})||^2 (eq. 8) for delta; 0.0 when not known (k = 0)
GNORM2_PREV = "gnorm2-prev"
FEDVECA_ESTIMATE = "fedveca-estimate"  # bool, True when beta and delta are wanted (k >= 1)
BETA_MODE = "beta-mode"  # str, one of BETA_MODES (FedVeca Assumption 3)
BETA_MODES = ("same-batch", "literal")  # the client-side beta estimators
DYNAMICFL_PAPER_SGD = {BATCH_SIZE: 10, LR: 0.01, MOMENTUM: 0.9, WEIGHT_DECAY: 5e-4}
"""What DynamicFL's ``train_chunk`` uses without the ClientApp's own optimiser, for a
setting the train config does not send (Le et al., hyper-parameter table)."""
GRAD_SUBSAMPLE = "grad-subsample"  # int >= 0, examples for grad F_i(w_k); 0 = the whole local set
# client -> server
GRAD = "grad"  # ArrayRecord: grad F_i(w_k), the local full-data gradient at the received model
BETA = "beta"  # float >= 0, beta_(k,i) (Assumption 3, Alg. 2 line 16); when FEDVECA_ESTIMATE
DELTA = "delta"  # float >= 0, delta_(k,i) (Assumption 4, Alg. 2 line 18); when FEDVECA_ESTIMATE
LOSS_AT_GLOBAL = "loss-at-global"  # float, optional: F_i(w_k) on the gradient's examples

# --- DynamicFL (strategies/algorithms/dynamicfl.py; docs/strategies/dynamicfl.md) ----------------------
# server -> client, per chunk (ConfigRecord "config"): SERVER_ROUND is the round t,
# LOCAL_STEPS = NUM_STEPS
# int >= 0: local steps this client already did this round (chunk [s, s+k))
START_STEP = "start-step"
NUM_STEPS = "num-steps"  # int >= 1: steps of this chunk
ROUND_STEPS = "round-steps"  # int L >= 1: steps per round (length of the client's batch stream)
# client -> server, query reply (MetricRecord "metrics"), optional
# float > 0, bytes per round this client can move (tau_m); absent = unconstrained
COMM_BUDGET = "comm-budget"

# --- Client state kept across rounds (strategies/engine/client_states.py, client/state.py) -
# server -> client, per node (ConfigRecord "config"): int >= 0, the round whose accepted
# reply produced the state the server holds for this client (0 = the initial state)
STATE_ROUND = "state-round"
# server -> client: ArrayRecord, the server's copy of the client's state, attached when the
# server cannot be sure the node holds that version (after a resume, a failed reply, ...)
CLIENT_STATE = "client-state"
# client -> server (MetricRecord "metrics"): the state round it started from (echo of
# STATE_ROUND) and the 63-bit digest of that state (strategies.engine.client_states.state_digest)
STATE_ROUND_USED = STATE_ROUND
STATE_DIGEST = "state-digest"

# --- SCAFFOLD (strategies/algorithms/scaffold.py; Karimireddy et al. 2020, Algorithm 1) ----------
SCAFFOLD_C = "scaffold-c"  # server -> client: ArrayRecord, the server control variate c
SCAFFOLD_DELTA_C = "scaffold-delta-c"  # client -> server: ArrayRecord, delta c_i = c_i+ - c_i

# --- FedDyn (strategies/algorithms/feddyn.py; Acar et al. 2021, Algorithm 1) -------------------
FEDDYN_ALPHA = "feddyn-alpha"  # server -> client (config): float > 0, alpha of the regulariser

# --- MOON (strategies/algorithms/moon.py; Li, He and Song 2021, Eqs. (3)-(4)) -------------------
MOON_MU = "moon-mu"  # server -> client (config): float >= 0, mu, weight of l_con (Eq. 4)
MOON_TEMPERATURE = "moon-temperature"  # server -> client (config): float > 0, tau (Eq. 3)
# client -> server (metrics): float, the mean l_con over the local steps (0 without a
# previous local model)
MOON_CONTRASTIVE_LOSS = "moon-contrastive-loss"

# === Run log ======================================================================
# One JSON object per round in ``rounds.jsonl``: the ServerApp's own keys plus the
# diagnostics a strategy returns for that round. Every key is spelled here once; the
# run log, report tables, plots and tests import these names.

# --- written by the ServerApp every round (fedapp/server_app.py) ------------------
LOG_ROUND = "round"  # int, the server round (1-based)
# accuracy, loss and eval-seconds are absent from the rounds the server does not evaluate
# accuracy and loss are on the run-config's evaluation-split: the test split, or for a tuning
# run the validation split held out of the training split (config.json "evaluation",
# summary.json "evaluation-split")
LOG_ACCURACY = "accuracy"  # float, centralised accuracy of the round's global model
LOG_LOSS = "loss"  # float, centralised loss of the round's global model
LOG_WALL_SECONDS = "wall-seconds"  # float, the round's seconds on the server's critical path
LOG_ELAPSED_SECONDS = "elapsed-seconds"  # float, seconds since the run started
LOG_EVAL_SECONDS = "eval-seconds"  # float, seconds of the centralised evaluation
LOG_SERVER_MAX_RSS_MB = "server-max-rss-mb"  # float, peak resident MB of the ServerApp
LOG_EVAL_MAX_RSS_MB = "eval-max-rss-mb"  # float, peak resident MB of its evaluation process
# str, sha256 of the round's global model (sorted keys; key|dtype|shape| then the bytes):
# two runs agree bit for bit in round r exactly when their digests of round r agree
LOG_MODEL_SHA256 = "model-sha256"

# --- written by every FedAvg-family strategy (strategies/algorithms/fedavg.py) ----------------
LOG_CLIENTS_SAMPLED = "clients-sampled"  # int, m clients drawn this round
LOG_CLIENTS_STRAGGLERS = "clients-stragglers"  # int, drawn clients marked stragglers
LOG_CLIENTS_DROPPED = "clients-dropped"  # int, stragglers not sent a train message
LOG_CLIENTS_RECEIVED = "clients-received"  # int, replies accepted into the aggregate
LOG_CLIENTS_FAILED = "clients-failed"  # int, drawn clients without an accepted reply
LOG_BYTES_UP = "bytes-up"  # int, bytes of arrays received from clients
LOG_BYTES_DOWN = "bytes-down"  # int, bytes of arrays sent to clients
LOG_LOCAL_STEPS = LOCAL_STEPS_TAKEN  # list[int], tau_i of the accepted replies
LOG_TRAIN_LOSS = TRAIN_LOSS  # float, weighted mean client training loss
LOG_MODEL_KEPT = "model-kept"  # bool, True when no reply was accepted (w_{t+1} = w_t)
LOG_DRIFT_COSINE = "drift-cosine"  # dict layer -> mean cosine(client update, mean update)
LOG_DRIFT_COSINE_MEAN = "drift-cosine-mean"  # float, mean of LOG_DRIFT_COSINE over layers
LOG_UPDATE_NORM_MEAN = "update-norm-mean"  # float, mean ||w_i - w|| over accepted clients
LOG_UPDATE_NORM_CV = "update-norm-cv"  # float, std / mean of those norms
LOG_LR = LR  # float, lr sent this round (lr_t of strategies.engine.schedules; also DynamicFL)

# --- FedNova (strategies/algorithms/fednova.py) ----------------------------------------------
LOG_A_NORMS = "a-norms"  # list[float], ||a_i||_1 per accepted client (Wang et al. eq. 6)
LOG_TAU_EFF = "tau-eff"  # float, tau_eff = sum_i p_i ||a_i||_1 (Wang et al. eq. 7)

# --- FedVeca (strategies/algorithms/fedveca.py) -----------------------------------------------
# dicts are keyed by the client key (partition id when known, else node id) as a string
LOG_FEDVECA_TAU_SENT = "fedveca-tau-sent"  # dict, tau_(k,i) sent this round
LOG_FEDVECA_ESTIMATE = FEDVECA_ESTIMATE  # bool, beta/delta were requested this round
LOG_FEDVECA_TAU = "fedveca-tau"  # dict, tau_(k,i) executed (reported local steps)
LOG_FEDVECA_TAU_K = "fedveca-tau-k"  # float, tau_k = sum_i p_i tau_(k,i)
LOG_FEDVECA_TAU_NEXT = "fedveca-tau-next"  # dict, tau_(k+1,i) decided this round
LOG_FEDVECA_TAU_K_NEXT = "fedveca-tau-k-next"  # float, tau_(k+1)
LOG_FEDVECA_TAU_TABLE = "fedveca-tau-table"  # dict, the server's whole tau table
LOG_FEDVECA_GNORM2 = "fedveca-gnorm2"  # float, ||grad F(w_k)||^2
LOG_FEDVECA_L_LATEST = "fedveca-L-latest"  # float | None, this round's smoothness estimate
LOG_FEDVECA_L = "fedveca-L"  # float | None, the smoothness estimate in use
LOG_FEDVECA_ETA_TAU_K_L = "fedveca-eta-tau-k-L"  # float | None, eta tau_k L
LOG_FEDVECA_BETA = "fedveca-beta"  # dict, beta_(k,i)
LOG_FEDVECA_DELTA = "fedveca-delta"  # dict, delta_(k,i)
LOG_FEDVECA_A = "fedveca-A"  # dict, A_(k,i), the per-client effect
LOG_FEDVECA_R = "fedveca-r"  # dict, the ratio that decides tau_(k+1,i)
LOG_FEDVECA_SIGN = "fedveca-sign"  # dict, +1 / -1 / 0 step direction of tau_(k+1,i)
LOG_FEDVECA_REASON = "fedveca-reason"  # dict, why tau_(k+1,i) was chosen
LOG_FEDVECA_MIN_A = "fedveca-min-A"  # float | None, min_i A_(k,i)
LOG_FEDVECA_ALPHA_BOUND = "fedveca-alpha-bound"  # float | None, upper bound on alpha
LOG_FEDVECA_ETA_TAU_K_L_UPPER = "fedveca-eta-tau-k-L-upper"  # float | None, 4 / (2 + eps)

# --- DynamicFL (strategies/algorithms/dynamicfl.py) -------------------------------------------
LOG_DYNAMICFL_GROUP_SIZE = "dynamicfl-group-size"  # int, |z| high-frequency group size
LOG_DYNAMICFL_KL = "dynamicfl-kl"  # float | None, KL of the chosen group's label mix
LOG_KAPPA_HAT = "kappa-hat"  # float, planned syncs per client and step
LOG_SYNCS = "syncs"  # int, planned synchronisations this round
LOG_SYNC_EVENTS = "sync-events"  # int, synchronisation events actually run
LOG_SECONDS_PER_EVENT = "seconds-per-event"  # float, wall seconds per sync event

# --- client state (strategies/engine/client_states.py): SCAFFOLD, FedDyn, MOON --------------
LOG_CLIENT_STATE_ATTACHED = "client-state-attached"  # int, train messages carrying the copy
LOG_CLIENT_STATE_ROUNDS = "client-state-rounds"  # list[int], state round each accepted reply used

# --- SCAFFOLD (strategies/algorithms/scaffold.py) --------------------------------------------
LOG_SCAFFOLD_C_NORM = "scaffold-c-norm"  # float, ||c|| after the round (Alg. 1 line 17)

# --- FedDyn (strategies/algorithms/feddyn.py) -------------------------------------------------
LOG_FEDDYN_H_NORM = "feddyn-h-norm"  # float, ||h^t|| after the round (Alg. 1)

# --- MOON (strategies/algorithms/moon.py) ----------------------------------------------------
LOG_MOON_CONTRASTIVE_LOSS = MOON_CONTRASTIVE_LOSS  # float, num-examples-weighted mean l_con

# --- asynchronous strategies (strategies/algorithms/fedbuff.py, strategies/algorithms/fedasync.py) -------
# One round = one server model update (FedBuff: a full buffer; FedAsync: updates-per-round
# applied client updates).
LOG_STALENESS = "staleness"  # list[int], staleness of each client update applied this round
LOG_CONCURRENCY = "concurrency"  # int, client tasks in flight when the round's update was made
LOG_BUFFER_FILL = "buffer-fill"  # int, client updates in the buffer at the server step
LOG_CLIENT_UPDATES = "client-updates"  # int, client updates applied since the start
LOG_MODEL_VERSION = "model-version"  # int, server model versions made since the start
# --- robust aggregation (strategies/engine/robust.py; FedAvg-family strategies, FedBuff) -----
# Logged only when a robust rule is given (Yin et al. 2018, Definitions 1 and 2).
LOG_ROBUST_AGGREGATION = "robust-aggregation"  # str, the rule: median, trimmed-mean
LOG_ROBUST_TRIM = "robust-trim"  # float, the trimmed mean's beta (fraction left out at each end)
LOG_ROBUST_VALUES = "robust-values"  # int, client updates each coordinate's statistic is over
LOG_ROBUST_TRIMMED = "robust-trimmed"  # int, of those, left out at each end (median: (m-1)//2)
# --- over-commitment (strategies/engine/participation.py, any synchronous strategy) ----------
LOG_CLIENTS_LATE = "clients-late"  # int, over-committed clients whose replies came after the m-th

# --- client selection (strategies/selection*.py; any strategy's participation model) --
# Logged when the policy is not random (random keeps today's run log).
LOG_SELECTION = "selection"  # str, the policy: oort, power-of-choice, tifl
LOG_SELECTION_CANDIDATES = "selection-candidates"  # int, online clients it chose among
LOG_SELECTION_CHOSEN = "selection-chosen"  # list[str], client keys chosen, in choice order
LOG_SELECTION_SCORES = "selection-scores"  # dict key -> the score that chose the client
LOG_OORT_EPSILON = "oort-epsilon"  # float, exploration factor of the round (Alg. 1)
LOG_OORT_PREFERRED_SECONDS = "oort-preferred-seconds"  # float, T after the pacer (Alg. 1)
LOG_OORT_EXPLORED = "oort-explored"  # int, unexplored clients chosen (exploration)
LOG_OORT_BLACKLISTED = "oort-blacklisted"  # int, clients left out for too many rounds
LOG_POC_LOSSES = "poc-losses"  # dict key -> loss on the global model of the d candidates
LOG_POC_QUERY_MESSAGES = "poc-query-messages"  # int, evaluate messages sent to query losses
LOG_POC_QUERY_BYTES = "poc-query-bytes"  # int, array bytes those messages carried
LOG_POC_QUERY_SECONDS = "poc-query-seconds"  # float, simulated seconds the query delayed the round
LOG_TIFL_TIER = "tifl-tier"  # int, the tier chosen (0 = fastest)
LOG_TIFL_PROBABILITIES = "tifl-probabilities"  # list[float], tier probabilities (Alg. 2)
LOG_TIFL_CREDITS = "tifl-credits"  # list[int], credits left per tier after the choice

# --- packed mode (strategies/engine/packing.py, strategies/client/packing.py) ----------------
# N virtual clients served by W SuperNodes: each SuperNode gets one message holding its
# share of an exchange's messages; its reply holds one reply per virtual client.
PACKED = "packed"  # ConfigRecord of a packed message: the virtual clients it holds
PACKED_NODE_IDS = "virtual-node-ids"  # list[int], their node ids, in the order run
PACKED_PARTITION_IDS = "partition-ids"  # list[int], their partition ids
PACKED_MESSAGE_IDS = "message-ids"  # list[str], their messages' ids
PACKED_NUM_PARTITIONS = "num-partitions"  # int, N (the virtual clients' num-partitions)
PACKED_CONTENT = "v"  # record name f"v{i}:{name}": record `name` of virtual client i
PACKED_STATE = "s"  # f"s{i}:{name}": its Context.state record (travels with the client)
PACKED_ERROR = "e"  # f"e{i}": ConfigRecord {code, reason}: its handler raised / errored
PACKED_ERROR_CODE = "code"  # int, Flower's error code
PACKED_ERROR_REASON = "reason"  # str
# a packed reply's records travel as a few byte strings (blocks of about 16 MiB: the .npy
# bytes of the arrays, the MetricRecords / ConfigRecords as Flower serialises them) plus one
# index, so Flower moves a few objects per reply, not several per virtual client
# (strategies/engine/packed_records.py: ReplyWriter, read_reply)
PACKED_BYTES = "packed-bytes"  # ArrayRecord {str(block): Array of stype PACKED_BYTES_STYPE}
PACKED_BYTES_STYPE = "fedhetero.packed-bytes"  # raw bytes, not an .npy payload
PACKED_INDEX = "packed-index"  # ConfigRecord: where each record's bytes lie (lists below)
PACKED_INDEX_ORDER = "order"  # list[str], every record name of the reply, in order
PACKED_INDEX_RECORDS = "records"  # list[str], the ArrayRecords' names
PACKED_INDEX_RECORD_BLOCKS = "record-blocks"  # list[int], the block of each one's arrays
PACKED_INDEX_RECORD_SIZES = "record-sizes"  # list[int], each one's number of arrays
PACKED_INDEX_KEYS = "keys"  # list[str], per array: its key, dtype, stype, ndim, ...
PACKED_INDEX_DTYPES = "dtypes"  # list[str]
PACKED_INDEX_STYPES = "stypes"  # list[str]
PACKED_INDEX_NDIMS = "ndims"  # list[int]
PACKED_INDEX_DIMS = "dims"  # list[int], every array's shape, one after another
PACKED_INDEX_OFFSETS = "offsets"  # list[int], where its bytes start in its block
PACKED_INDEX_SIZES = "sizes"  # list[int], how many bytes
PACKED_INDEX_SERIALIZED = "serialized"  # list[str], the MetricRecords' / ConfigRecords' names
PACKED_INDEX_SERIALIZED_KINDS = "serialized-kinds"  # list[str], "MetricRecord" / "ConfigRecord"
PACKED_INDEX_SERIALIZED_BLOCKS = "serialized-blocks"  # list[int]
PACKED_INDEX_SERIALIZED_OFFSETS = "serialized-offsets"  # list[int]
PACKED_INDEX_SERIALIZED_SIZES = "serialized-sizes"  # list[int]
VIRTUAL_CLIENT = "virtual-client"  # node-config key, True in a virtual client's Context

# Keys that count what the server sends again after a resume: every client's copy of its
# state (strategies.engine.client_states), an asynchronous strategy's tasks in flight at the
# checkpoint (strategies.engine.async_tasks). The first round after a resume differs from an
# uninterrupted run's in these keys only.
LOG_RESEND_KEYS = frozenset({LOG_BYTES_DOWN, LOG_CLIENT_STATE_ATTACHED, LOG_CLIENTS_SAMPLED})

# --- the simulated clock (strategies/engine/clock.py; any strategy given a SimClock) --------
LOG_SIM_SECONDS = "sim-seconds"  # float, simulated seconds of the round (strategies.engine.clock eq. 1)
LOG_SIM_ELAPSED = "sim-elapsed"  # float, simulated seconds since the start, this round included
LOG_SIM_WAIT_SECONDS = "sim-wait-seconds"  # float, part of sim-seconds waiting for a device window
LOG_CLIENTS_UNAVAILABLE = "clients-unavailable"  # int, connected clients offline this round
# logged with a clock whose dropout is > 0 (device-dropout; synchronous strategies): the
# clients sent work that dropped out before replying (their replies discarded; also failed)
LOG_CLIENTS_DROPPED_OUT = "clients-dropped-out"  # int, clients that dropped out this round
LOG_DROPPED_OUT = "dropped-out"  # list[str], their client keys (partition ids), in order
LOG_SIM_SECONDS_PER_EVENT = "sim-seconds-per-event"  # float, DynamicFL: sim-seconds / sync events

# --- width-heterogeneous sub-models (strategies/engine/submodels.py) -----------------------
LOG_CLIENT_WIDTHS = "client-widths"  # dict[str, float], each client's width r this round, by partition id
LOG_WIDTH_COUNTS = "width-counts"  # dict[str, int], clients sent work per width this round
LOG_WIDTH_ACCURACY = "width-accuracy"  # dict[str, float], test accuracy of each width's static sub-model
LOG_WIDTH_RULE = "width-rule"  # str, how the widths were chosen: deadline, fixed, dynamic

# Keys whose values depend on the machine, not on the run's seed (ignored by
# bit-identity comparisons of run logs).
LOG_TIMING_KEYS = frozenset({LOG_WALL_SECONDS, LOG_ELAPSED_SECONDS, LOG_EVAL_SECONDS,
                             LOG_SERVER_MAX_RSS_MB, LOG_EVAL_MAX_RSS_MB,
                             LOG_SECONDS_PER_EVENT})

# Keys with one value per candidate client of a round (the selection's working: Oort's
# utilities, Power-of-Choice's d losses): most of a selection run's log, read by no report.
LOG_PER_CANDIDATE_KEYS = frozenset({LOG_SELECTION_SCORES, LOG_POC_LOSSES})
# Keys with one value per client sent work that another key sums up (each client's width:
# width-counts has how many trained each width; the clients that dropped out:
# clients-dropped-out counts them), read by no report.
LOG_PER_CLIENT_KEYS = frozenset({LOG_CLIENT_WIDTHS, LOG_DROPPED_OUT})


# Run-log records: a round's report is made of Sections whose fields name their LOG_* key.

def logged(key: str, *, keep_none: bool = False, default: object = None):
    """A section field logged under ``key``; a None value is left out of the record unless
    ``keep_none`` (the key is then logged as null: "not computable this round")."""
    return field(default=default, metadata={"key": key, "keep_none": keep_none})


@dataclass(frozen=True)
class Section:
    """A part of a round's report; subclasses declare their fields with :func:`logged`."""

    def log_items(self) -> dict[str, object]:
        """{run-log key: value} of the fields, None values left out (unless ``keep_none``)."""
        items = {}
        for f in dataclasses.fields(self):
            key = f.metadata.get("key")
            value = getattr(self, f.name)
            if key is None or (value is None and not f.metadata.get("keep_none")):
                continue
            items[key] = value
        return items


# --- HeteroFL's and FedRolex's label split (strategies/engine/submodels.py; the authors' code) ---
# server -> client, per node (ConfigRecord "config"): bool, True: train with the cross-entropy
# whose logits of the labels absent from the local training data are 0 (masked), and reply
# LABEL_MASK (strategies.client.width.LabelSplit)
LABEL_SPLIT = "label-split"
# client -> server (MetricRecord "metrics"): list[int], one 0/1 entry per class (the rows of the
# model's output layer), 1 for each label in the client's training data, at least one
LABEL_MASK = "label-mask"
