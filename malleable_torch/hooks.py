"""Every optimizer's step, seen without code changes: PyTorch's global optimizer hooks
(``torch.optim.optimizer.register_optimizer_step_pre_hook`` and ``..._post_hook``, which run
around each ``Optimizer.step`` of every optimizer, subclasses included).

Before a step: the thread that steps is the training thread, and a posted resize applies there
(``threads.TorchThreads``). After it: one training step is counted (a step that raised applied
nothing). An optimizer stepped inside another's step (a wrapper's inner optimizer) is one step.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from .threads import TorchThreads

_outer = threading.local()   # the optimizer whose step is under way in this thread


def install(threads: TorchThreads, count_step: Callable[[], None] | None) -> list[Any]:
    """Register the hooks; returns their handles (``handle.remove()`` takes one away)."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    def before(optimizer: object, args: object, kwargs: object) -> None:
        if getattr(_outer, "optimizer", None) is None:
            _outer.optimizer = optimizer
        threads.training_thread_is_here()

    def after(optimizer: object, args: object, kwargs: object) -> None:
        # The outer step's own (a step that raised left it set: its next step clears it).
        if getattr(_outer, "optimizer", None) is optimizer:
            _outer.optimizer = None
            if count_step is not None:
                count_step()

    return [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
