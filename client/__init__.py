"""The volunteer node app: node loop, wallet CLI, TUI and hardware detection."""
