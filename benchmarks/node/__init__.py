"""The node: the agent, its hooks, root's parsers, steps on a real cluster."""
