"""The pyasc command line."""
