"""The per-node co-scheduler: request grammar, pure policies, reconciler, actuators."""
