"""Flower's deployment runtime for this app: one SuperLink, N SuperNodes, TLS, node auth.

``python -m deploy run`` starts everything on this machine, runs the app with
``flwr run . <connection> --stream`` and stops what it started, by PID. See
deploy/README.md for several machines.
"""
