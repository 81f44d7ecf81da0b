"""The run loop and its reports: compare (check, then time, every row), isolation (a user's
kernel in a worker process), results (rows, JSON, CSV), render (the table), plotting, and the
machine a run is on (machine)."""
