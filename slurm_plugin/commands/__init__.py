"""The ``malleable`` command (``main``) and what its operator subcommands show: ``status`` (the
jobs' cores and threads per node, from the feed and the ledger) and ``doctor`` (what a node has
of the install, and what to do about each missing part)."""
