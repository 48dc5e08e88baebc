"""Rank 0 -> worker ranks: each step's forward inputs, or None to stop. Broadcast over the group's gloo control
group as one pickled object (host tensors), so worker ranks run exactly the forward rank 0 runs. Knows nothing
of what is inside the object.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from diffuserve.distributed.group import ParallelGroup


class StepChannel:
    def __init__(self, group: ParallelGroup) -> None:
        self.group = group

    def send(self, message: Any) -> None:
        """Rank 0: broadcasts `message` (None = stop) to every other rank."""
        dist.broadcast_object_list([message], src=0, group=self.group.control_group)

    def receive(self) -> Any:
        """Worker ranks: blocks until rank 0's next message."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group.control_group)
        return box[0]
