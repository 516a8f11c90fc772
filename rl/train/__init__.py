"""rl.train — what the RL loop calls, one module per concern (docs/ARCHITECTURE.md lists them); loads nothing."""
