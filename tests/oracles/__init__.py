"""Test oracles: reference simulators and brute-force solvers the product is checked against."""
