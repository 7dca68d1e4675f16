"""One module per paper: each algorithm, its pure math beside it."""
