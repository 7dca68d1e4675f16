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
LOCAL_EPOCHS = "local-epochs"  # int >= 1, used when LOCAL_STEPS is 0
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
