"""The self-test harness: the offline probe, the gateway harness, the fake LLM, the recall eval
(+ data/), the demo scenarios."""
