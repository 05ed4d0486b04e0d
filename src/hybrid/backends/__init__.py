"""Built-in hardware backends. Each module imports its library only when probed."""
