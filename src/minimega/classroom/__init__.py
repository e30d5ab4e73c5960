"""The classroom: quiz banks, the graded exam service and verifiable certificates."""
