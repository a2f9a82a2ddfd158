"""What every process shares to be run and watched: command-line flags, logs and metrics."""
