"""Exit codes scripts can rely on, shared by the CLI and the core jobs (audit) that decide them."""

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and found a problem (e.g. audit parity broken)
EXIT_USAGE = 2  # bad arguments or unreadable input
EXIT_NO_DATA = 3  # the database holds nothing to work on
EXIT_NOT_BETTER = 4  # calibrate: the fit scores worse on held-out data than the table in force (not written)
