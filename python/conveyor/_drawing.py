"""The schedules the library knows, and their pictures, drawn by the library itself."""
from typing import List, Optional, Sequence, Union

from . import _C


def schedule_names(synchronous: Optional[bool] = None) -> List[str]:
    """The names ``schedule=`` takes: all of them, or only the synchronous
    ones (the whole batch's exact gradients, one update a step) or the
    asynchronous ones (an update every micro-batch, with the staleness their
    method defines)."""
    return list(_C.schedule_names(synchronous))


def schedule_svg(names: Union[str, Sequence[str]], workers: int, microbatches: int, chunks: int = 0,
                 shard: Optional[str] = None) -> str:
    """The named schedules as an SVG timeline: a row per worker, forwards and
    backwards in two colours with their micro-batch numbers, idle time grey
    (with virtual stages, as the interleaved and V schedules have, a row is
    a worker and runs several stages).

    Each schedule is simulated with a forward of 1 ms and a backward of 2 ms
    on every stage (a split backward: an input gradient and a weight
    gradient of 1 ms each), so the picture shows the schedule's shape and its
    bubble, not a model's times; several names are drawn one above the other
    on one time axis. ``chunks`` is the stages per worker (0: the schedule's
    own). A step of a real model is drawn by ``StepResult.timeline_svg()``.

    ``shard`` draws where a stage sharded across its replicas gathers its
    parameters (UNSHARD, 0.5 ms) and reduces its gradients (REDUCE_GRAD,
    1 ms), in a strip under each worker: ``shard="parameters"`` is ZeRO-3,
    and the ``ValueError`` of an unknown level lists the others.

    Raises ``ValueError`` for an unknown schedule or counts it does not take::

        svg = conveyor.schedule_svg(["1f1b", "zb-v"], workers=4, microbatches=8)
        with open("schedules.svg", "w") as f:
            f.write(svg)
    """
    if isinstance(names, str):
        names = [names]
    return _C.schedule_svg(list(names), workers, microbatches, chunks, shard)
