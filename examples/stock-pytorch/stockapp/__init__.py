"""A stock Flower PyTorch app (template style) whose ServerApp uses fedhetero's strategies."""
