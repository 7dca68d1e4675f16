"""fedhetero's Flower app: ServerApp, ClientApp and the run-config view they share."""
