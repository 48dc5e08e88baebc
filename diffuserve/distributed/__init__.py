"""Running one engine over several processes: the process group, worker processes, the step channel.

Knows process groups and channels only, never models or the engine: a worker process runs a target its caller
builds (the engine passes one that builds the rank's executor and serves rank 0's forwards).
"""
