"""The runtime core: compile, compiled models, plans, and the execution machinery."""
