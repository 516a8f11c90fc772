"""rl.report — what a run says about itself: the metric names of metrics.jsonl (`metrics`), the console line of
each step (`console`)."""
