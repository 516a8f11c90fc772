"""rl.report — what a run says about itself: metric names, step lines, figures (docs/ARCHITECTURE.md has the list)."""
