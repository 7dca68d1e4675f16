"""The round engine and the parts it is given (flwr + numpy only)."""
