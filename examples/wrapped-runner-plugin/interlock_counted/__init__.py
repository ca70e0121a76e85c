"""interlock-counted-runner: the runner ``counted``, mrv1 counting what it executes."""
