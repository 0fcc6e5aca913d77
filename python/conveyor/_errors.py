"""The exceptions a pipeline raises besides ValueError (bad options or inputs)."""

__all__ = ["PipelineError", "PipelineTimeoutError", "DivergenceError"]


class PipelineError(RuntimeError):
    """A step failed inside the pipeline. ``stage`` and ``microbatch`` say
    where (-1 when not tied to one), ``action`` the schedule's action in its
    text form (``"1F3"``: stage 1's forward of micro-batch 3; empty if none).
    The step is rolled back: an asynchronous schedule's weights and optimizer
    state are those it started from."""

    def __init__(self, message, stage=-1, microbatch=-1, action=""):
        super().__init__(message)
        self.stage = stage
        self.microbatch = microbatch
        self.action = action


class PipelineTimeoutError(PipelineError, TimeoutError):
    """A blocking wait inside the step ran past the pipeline's ``timeout``: a
    stage (or a peer process) stalled or died. Also a ``TimeoutError``."""


class DivergenceError(PipelineError):
    """A non-finite loss or gradient stopped training (``divergence_guard``);
    the weights are those of the last good step."""
