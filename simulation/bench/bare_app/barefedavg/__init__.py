"""Bare Flower FedAvg app: the baseline of fedhetero's scale benchmark."""
