"""The node's agent, a long-running root daemon (``malleable agent``, ``malleable-agent@.service``):
``agent`` (the loop: a reconcile cycle on every wake or timeout), ``step_socket`` (the root-only
socket the SPANK plugin asks before a step starts in a grown job), ``metrics`` (Prometheus)."""
