"""rl.report — what a run says about itself: the metric names of metrics.jsonl and the step row (`metrics`), the
console line of each step (`console`), the figures drawn from metrics.jsonl (`plots`), kept current during a run by a
process of their own (`live_plots`)."""
