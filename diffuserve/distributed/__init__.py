"""Running one engine over several processes: the process group, worker processes, the step broadcast."""
