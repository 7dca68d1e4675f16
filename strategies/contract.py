"""The message contract: every key a strategy sends and every key it reads.

This module is the only place where these strings are spelled out. Server and
client code, the README table and the tests all import the names from here.

Server -> client (ConfigRecord ``"config"`` of a train / evaluate / query message)
Client -> server (MetricRecord ``"metrics"`` and ArrayRecord ``"arrays"`` of a reply)
"""

# Record names inside a Message's RecordDict (Flower's own defaults).
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# --- server -> client: ConfigRecord "config" ------------------------------------
SERVER_ROUND = "server-round"  # int, injected every round (Flower's key)
LR = "lr"  # float, local learning rate
LOCAL_EPOCHS = "local-epochs"  # number > 0 (fractions allowed: tau_i = max(1, floor(E n_i / B))), used when LOCAL_STEPS is 0
LOCAL_STEPS = "local-steps"  # int >= 0; > 0 means "exactly this many SGD steps"
BATCH_SIZE = "batch-size"  # int >= 0; 0 means full local batch (B = inf)
MOMENTUM = "momentum"  # float in [0, 1)
WEIGHT_DECAY = "weight-decay"  # float >= 0
PROXIMAL_MU = "proximal-mu"  # float >= 0 (Flower's FedProx key)
SEED = "seed"  # int, run seed; clients derive (seed, round, partition) streams

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

# --- FedVeca (strategies/fedveca.py; docs/fedveca.md) ----------------------------
# server -> client, per node (ConfigRecord "config"): LOCAL_STEPS is this client's tau_(k,i)
GNORM2_PREV = "gnorm2-prev"  # float, ||grad F(w_{k-1})||^2 (eq. 8) for delta; 0.0 when not known (k = 0)
FEDVECA_ESTIMATE = "fedveca-estimate"  # bool, True when beta and delta are wanted (k >= 1)
BETA_MODE = "beta-mode"  # str, "same-batch" or "literal" (spec §4.6)
GRAD_SUBSAMPLE = "grad-subsample"  # int >= 0, examples for grad F_i(w_k); 0 = the whole local set
# client -> server
GRAD = "grad"  # ArrayRecord: grad F_i(w_k), the local full-data gradient at the received model
BETA = "beta"  # float >= 0, beta_(k,i) (Assumption 3, Alg. 2 line 16); when FEDVECA_ESTIMATE
DELTA = "delta"  # float >= 0, delta_(k,i) (Assumption 4, Alg. 2 line 18); when FEDVECA_ESTIMATE
LOSS_AT_GLOBAL = "loss-at-global"  # float, optional: F_i(w_k) on the gradient's examples

# --- DynamicFL (strategies/dynamicfl.py; docs/dynamicfl.md) ----------------------
# server -> client, per chunk (ConfigRecord "config"): SERVER_ROUND is the round t, LOCAL_STEPS = NUM_STEPS
START_STEP = "start-step"  # int >= 0: local steps this client already did this round (chunk [s, s+k))
NUM_STEPS = "num-steps"  # int >= 1: steps of this chunk
ROUND_STEPS = "round-steps"  # int L >= 1: steps per round (length of the client's batch stream)
# client -> server, query reply (MetricRecord "metrics"), optional
COMM_BUDGET = "comm-budget"  # float > 0, bytes per round this client can move (tau_m); absent = unconstrained
