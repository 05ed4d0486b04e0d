"""What the server reports about itself: Prometheus metrics, Triton's statistics, latency summaries and traces."""
