"""rl.report — what a run says about itself: the metric names of metrics.jsonl and the step row (`metrics`), the
console line of each step (`console`), the figures drawn from metrics.jsonl (`plots`)."""
