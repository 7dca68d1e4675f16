"""Experiments on Flower's simulation engine (``python -m simulation --help``).

``runtime/`` drives ``flwr run`` and Ray; ``sweep``, ``report``, ``results``, ``bench`` and
``metrics`` are the generic tools; ``reliability/`` holds the in-process fault Grid, the
faults table and the resume check; ``experiments/`` the sweep files and paper drivers.
"""
